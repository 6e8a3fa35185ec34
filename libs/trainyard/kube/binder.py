"""Bind placements to Kubernetes through the official client; all logic is in translate.py.

This layer only reads objects, calls the pure translation and writes the
result back.  It needs a reachable API server (JobSet CRD installed for
JobSets); its calls are checked against the client's signatures, never
against a live API server (docs/placement.md).  The placement service uses it
when ``TRAINYARD_PLACEMENT_BINDER=kube``.
"""

from __future__ import annotations

from typing import Any

from trainyard.core.placement import NodeView, Placement
from trainyard.kube.nodes import node_view_from_k8s
from trainyard.kube.translate import GATE, TopologyLabels, bind_manifest, needs_bind, pin_pod

JOBSET_GROUP = "jobset.x-k8s.io"
JOBSET_VERSION = "v1alpha2"
JOBSET_PLURAL = "jobsets"


class KubeBinder:
    """Writes placements onto suspended Jobs / JobSets and pins their gated pods."""

    def __init__(self, api_client: Any = None) -> None:
        from kubernetes import client, config  # imported here so the pure parts never load the client

        if api_client is None:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
        self._api = api_client or client.ApiClient()
        self._custom = client.CustomObjectsApi(self._api)
        self._batch = client.BatchV1Api(self._api)
        self._core = client.CoreV1Api(self._api)

    def _plain(self, obj: Any) -> dict[str, Any]:
        return obj if isinstance(obj, dict) else self._api.sanitize_for_serialization(obj)

    def read(self, kind: str, namespace: str, name: str) -> dict[str, Any]:
        if kind == "JobSet":
            return self._plain(
                self._custom.get_namespaced_custom_object(JOBSET_GROUP, JOBSET_VERSION, namespace, JOBSET_PLURAL, name)
            )
        if kind == "Job":
            return self._plain(self._batch.read_namespaced_job(name, namespace))
        raise ValueError(f"cannot bind a {kind}; only Job and JobSet")

    def bind(self, kind: str, namespace: str, name: str, placement: Placement) -> dict[str, Any]:
        """Patch the suspended object with the placement and unsuspend it (one update, optimistic)."""
        current = self.read(kind, namespace, name)
        patched = bind_manifest(current, placement)  # keeps metadata.resourceVersion: a stale write fails
        if kind == "JobSet":
            return self._plain(
                self._custom.replace_namespaced_custom_object(
                    JOBSET_GROUP, JOBSET_VERSION, namespace, JOBSET_PLURAL, name, patched
                )
            )
        return self._plain(self._batch.replace_namespaced_job(name, namespace, patched))

    def create(self, namespace: str, manifest: dict[str, Any], placement: Placement) -> dict[str, Any]:
        """Create a Job / JobSet from a suspended manifest, already bound (GPU limits and env set too)."""
        bound = bind_manifest(manifest, placement, creating=True)
        if bound.get("kind") == "JobSet":
            return self._plain(
                self._custom.create_namespaced_custom_object(
                    JOBSET_GROUP, JOBSET_VERSION, namespace, JOBSET_PLURAL, bound
                )
            )
        return self._plain(self._batch.create_namespaced_job(namespace, bound))

    def pin_pods(self, kind: str, namespace: str, name: str, placement: Placement) -> int:
        """Pin every pod still held by the Trainyard gate; returns how many were pinned."""
        manifest = self.read(kind, namespace, name)
        key = "jobset.sigs.k8s.io/jobset-name" if kind == "JobSet" else "batch.kubernetes.io/job-name"
        selector = f"{key}={name}"
        pods = self._plain(self._core.list_namespaced_pod(namespace, label_selector=selector))
        pinned = 0
        for pod in pods.get("items") or []:
            gates = (pod.get("spec") or {}).get("schedulingGates") or []
            if not any(g.get("name") == GATE for g in gates):
                continue
            updated = pin_pod(pod, placement, manifest)
            if updated is not None:
                self._core.replace_namespaced_pod(pod["metadata"]["name"], namespace, updated)
                pinned += 1
        return pinned

    def reconcile(self, kind: str, namespace: str, name: str, placement: Placement) -> int:
        """Bind the object if it still waits for this run, then pin whichever of its
        pods are gated; returns how many pods were pinned.  Safe to repeat."""
        if needs_bind(self.read(kind, namespace, name), placement):
            self.bind(kind, namespace, name, placement)
        return self.pin_pods(kind, namespace, name, placement)

    def nodes(
        self, cluster: str, used: dict[str, tuple[int, ...]] | None = None, labels: TopologyLabels = TopologyLabels()
    ) -> list[NodeView]:
        """Every GPU node as placement sees it; ``used`` comes from Trainyard's own allocations."""
        listed = self._plain(self._core.list_node())
        views = []
        for node in listed.get("items") or []:
            name = (node.get("metadata") or {}).get("name", "")
            view = node_view_from_k8s(node, cluster, (used or {}).get(name, ()), labels)
            if view is not None:
                views.append(view)
        return views
