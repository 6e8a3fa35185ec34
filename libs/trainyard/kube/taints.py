"""Kubernetes side of node health: cordon and taint unhealthy nodes.

When health takes a node out of service, its Kubernetes Node is marked
unschedulable and tainted ``trainyard.io/unhealthy`` (effect ``NoSchedule``,
or ``NoExecute`` for a fatal fault, so pods leave a node whose GPU is gone).
When the node returns to service the taint is removed, and the Node is made
schedulable again only if Trainyard was the one that cordoned it (a person's
``kubectl cordon`` is left alone).  Taints of other owners, and the
``node.kubernetes.io/*`` taints of the node lifecycle controller, are never
touched.

``patch_for_state`` is pure (a Node as a dict in, a patch as a dict out) and
tested; ``KubeNodeTainter`` is the thin adapter over the official client.
The adapter was not run against a live API server.
"""

from __future__ import annotations

from typing import Any

TAINT_KEY = "trainyard.io/unhealthy"
CORDONED_ANNOTATION = "trainyard.io/cordoned"  # "true" while Trainyard holds the cordon
REASON_ANNOTATION = "trainyard.io/health-reason"
PROTECTED_PREFIX = "node.kubernetes.io/"
IN_SERVICE = "healthy"
MAX_REASON = 256


def _taints(node: dict[str, Any]) -> list[dict[str, Any]]:
    return list((node.get("spec") or {}).get("taints") or [])


def _annotations(node: dict[str, Any]) -> dict[str, str]:
    return dict((node.get("metadata") or {}).get("annotations") or {})


def cordon_patch(node: dict[str, Any], *, fatal: bool, reason: str) -> dict[str, Any] | None:
    """The patch that cordons and taints ``node``; None when it already is."""
    effect = "NoExecute" if fatal else "NoSchedule"
    others = [t for t in _taints(node) if t.get("key") != TAINT_KEY]
    ours = {"key": TAINT_KEY, "value": "true", "effect": effect}
    current = [t for t in _taints(node) if t.get("key") == TAINT_KEY]
    unschedulable = bool((node.get("spec") or {}).get("unschedulable"))
    annotations = _annotations(node)
    we_cordon = annotations.get(CORDONED_ANNOTATION) == "true" or not unschedulable
    if unschedulable and current == [ours] and annotations.get(REASON_ANNOTATION) == reason[:MAX_REASON]:
        return None
    patch: dict[str, Any] = {
        "metadata": {"annotations": {REASON_ANNOTATION: reason[:MAX_REASON]}},
        "spec": {"unschedulable": True, "taints": others + [ours]},
    }
    if we_cordon:
        patch["metadata"]["annotations"][CORDONED_ANNOTATION] = "true"
    _fence(node, patch)
    return patch


def uncordon_patch(node: dict[str, Any]) -> dict[str, Any] | None:
    """The patch that removes Trainyard's taint (and its cordon); None when there is nothing to undo."""
    taints = _taints(node)
    kept = [t for t in taints if t.get("key") != TAINT_KEY]
    annotations = _annotations(node)
    ours = annotations.get(CORDONED_ANNOTATION) == "true"
    if len(kept) == len(taints) and not ours and REASON_ANNOTATION not in annotations:
        return None
    patch: dict[str, Any] = {
        "metadata": {"annotations": {CORDONED_ANNOTATION: None, REASON_ANNOTATION: None}},
        "spec": {"taints": kept},
    }
    if ours:
        patch["spec"]["unschedulable"] = False
    _fence(node, patch)
    return patch


def patch_for_state(
    node: dict[str, Any], state: str, *, fatal: bool = False, reason: str = ""
) -> dict[str, Any] | None:
    """The patch that makes ``node`` match a Trainyard node state; None when it already does."""
    if state == IN_SERVICE:
        return uncordon_patch(node)
    return cordon_patch(node, fatal=fatal, reason=reason or f"trainyard: node is {state}")


def _fence(node: dict[str, Any], patch: dict[str, Any]) -> None:
    """Carry the resourceVersion: a patch computed from a stale read is refused (409)."""
    version = (node.get("metadata") or {}).get("resourceVersion")
    if version:
        patch["metadata"]["resourceVersion"] = version
    # The taint list is replaced whole; make sure protected taints survive unchanged.
    before = [t for t in _taints(node) if str(t.get("key", "")).startswith(PROTECTED_PREFIX)]
    after = [
        t for t in patch["spec"].get("taints", _taints(node)) if str(t.get("key", "")).startswith(PROTECTED_PREFIX)
    ]
    if before != after:
        raise AssertionError("node.kubernetes.io taints must never change")


class KubeNodeTainter:
    """Applies ``patch_for_state`` to the Node named like the Trainyard node (not tested live)."""

    def __init__(self, api_client: Any = None, retries: int = 3) -> None:
        from kubernetes import client, config  # imported here so the pure parts never load the client

        if api_client is None:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
        self._api = api_client or client.ApiClient()
        self._core = client.CoreV1Api(self._api)
        self.retries = retries

    def apply(self, node_name: str, state: str, *, fatal: bool = False, reason: str = "") -> bool:
        """True when the Node was patched; retries when someone else changed it first."""
        from kubernetes.client.exceptions import ApiException

        for attempt in range(self.retries):
            node = self._api.sanitize_for_serialization(self._core.read_node(node_name))
            patch = patch_for_state(node, state, fatal=fatal, reason=reason)
            if patch is None:
                return False
            try:
                self._core.patch_node(node_name, patch)
                return True
            except ApiException as err:
                if err.status != 409 or attempt == self.retries - 1:
                    raise
        return False

    def on_state_changed(self, event: Any) -> None:
        """Hook for the health service: ``event`` is a ``NodeStateChanged``."""
        self.apply(event.node_id, event.state, fatal=event.fatal, reason=event.reason)
