"""Pure translation between placement decisions and Kubernetes objects (plain dicts).

Binding follows the pattern Kubernetes allows for a suspended Job or JobSet
that has never run: its pod templates' scheduling directives (node selector,
node affinity, scheduling gates, labels and annotations) may change, nothing
else.  So binding a placement is two steps:

1. ``bind_manifest``: every role's pod template gets a required node affinity
   to the role's nodes (a ``kubernetes.io/hostname`` node selector when the
   role is one pod); a role of several pods also gets the scheduling gate
   ``trainyard.io/placement``; then ``spec.suspend`` becomes false.
2. ``pin_pod``: as each gated pod appears, it gets its own replica's node
   (node selector), its rank and GPU indices (annotations), and its gate is
   removed, so the scheduler binds it exactly where placement decided.

A workload reads its rank from the ``trainyard.io/rank`` annotation through
the downward API; ``creating=True`` adds that env var (and sets GPU limits)
for manifests Trainyard creates itself, since an existing Job's containers
cannot be changed.

Nodes go the other way (:mod:`trainyard.kube.nodes`).
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import msgspec

from trainyard.core.placement import Placement
from trainyard.events.jobs import ReplicaPlacement

QUEUE_LABEL = "trainyard.io/queue"
GATE = "trainyard.io/placement"
RANK_ANNOTATION = "trainyard.io/rank"
GPUS_ANNOTATION = "trainyard.io/gpus"
JOB_ANNOTATION = "trainyard.io/job-id"
RUN_ANNOTATION = "trainyard.io/run-id"
PLACEMENT_ANNOTATION = "trainyard.io/placement"
HOSTNAME = "kubernetes.io/hostname"
GPU_RESOURCE = "nvidia.com/gpu"
JOBSET_API = "jobset.x-k8s.io/"
ROLE_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"

Manifest = dict[str, Any]


class BindError(ValueError):
    """The manifest cannot carry this placement; the message says what to fix."""


class TopologyLabels(msgspec.Struct, frozen=True):
    """Node labels that say where a node sits and what GPUs it has."""

    zone: str = "topology.kubernetes.io/zone"
    block: str = "network.topology.kubernetes.io/block"
    rack: str = "network.topology.kubernetes.io/rack"
    nvlink: str = "nvidia.com/gpu.clique"
    product: str = "nvidia.com/gpu.product"
    tolerated_taints: frozenset[str] = frozenset({GPU_RESOURCE})  # taints GPU jobs always tolerate


# --- placement -> manifest ---


def bind_manifest(manifest: Manifest, placement: Placement, creating: bool = False) -> Manifest:
    """A copy of a suspended Job or JobSet with the placement's nodes and ``suspend: false``.

    Only scheduling directives, labels and annotations change, as Kubernetes
    allows on an existing suspended object.  ``creating=True`` is for a
    manifest Trainyard is about to create: it also sets each pod's GPU limit
    and the ``TRAINYARD_*`` env vars.
    """
    out = copy.deepcopy(manifest)
    meta = out.setdefault("metadata", {})
    what = f"{out.get('kind', '?')} {meta.get('name', '?')!r}"
    if QUEUE_LABEL not in (meta.get("labels") or {}):
        raise BindError(f"{what} has no {QUEUE_LABEL} label; Trainyard binds only the jobs it queues")
    spec = out.get("spec") or {}
    if spec.get("suspend") is not True:
        raise BindError(f"{what} is not suspended; create it with spec.suspend: true so Trainyard can place it")
    by_role: dict[str, list[ReplicaPlacement]] = {}
    for r in placement.replicas:
        by_role.setdefault(r.role, []).append(r)
    world = len(placement.replicas)
    for role, template, pods in _pod_templates(out, what, by_role):
        replicas = sorted(by_role[role], key=lambda r: r.replica)
        if len(replicas) != pods:
            raise BindError(f"{what}: role {role!r} has {pods} pods but the placement has {len(replicas)} replicas")
        _pin_template(template, replicas, placement, world, creating)
    annotations = meta.setdefault("annotations", {})
    annotations[JOB_ANNOTATION] = placement.job_id
    annotations[RUN_ANNOTATION] = placement.run_id
    annotations[PLACEMENT_ANNOTATION] = json.dumps(
        [[r.rank, r.role, r.replica, r.node_id] for r in sorted(placement.replicas, key=lambda r: r.rank)],
        separators=(",", ":"),
    )
    spec["suspend"] = False
    return out


def _pod_templates(manifest: Manifest, what: str, by_role: dict[str, list[ReplicaPlacement]]):
    """(role, pod template, pod count) for every role in the manifest."""
    kind = manifest.get("kind")
    spec = manifest["spec"]
    if kind == "JobSet" and str(manifest.get("apiVersion", "")).startswith(JOBSET_API):
        found = []
        for rj in spec.get("replicatedJobs") or []:
            name = rj.get("name")
            if name not in by_role:
                raise BindError(f"{what}: replicatedJob {name!r} is not a role of the placement")
            job_spec = rj.setdefault("template", {}).setdefault("spec", {})
            pods = int(rj.get("replicas", 1)) * _pods_per_job(job_spec)
            found.append((name, job_spec.setdefault("template", {}), pods))
        missing = set(by_role) - {f[0] for f in found}
        if missing:
            raise BindError(f"{what}: no replicatedJob for role(s) {sorted(missing)}")
        return found
    if kind == "Job" and manifest.get("apiVersion") == "batch/v1":
        if len(by_role) != 1:
            raise BindError(f"{what}: a batch/v1 Job has one pod template; use a JobSet for {len(by_role)} roles")
        (role,) = by_role
        return [(role, spec.setdefault("template", {}), _pods_per_job(spec))]
    raise BindError(f"{what}: only batch/v1 Job and jobset.x-k8s.io JobSet can be bound")


def _pods_per_job(job_spec: Manifest) -> int:
    """Pods of one Job that run at once; a gang needs every one of them running."""
    completions = job_spec.get("completions")
    parallelism = job_spec.get("parallelism")
    pods = int(completions or parallelism or 1)
    if parallelism is not None and int(parallelism) < pods:
        raise BindError(f"parallelism {parallelism} is below completions {pods}; a gang runs all its pods at once")
    return pods


def _pin_template(
    template: Manifest, replicas: list[ReplicaPlacement], placement: Placement, world: int, creating: bool
) -> None:
    meta = template.setdefault("metadata", {})
    pod = template.setdefault("spec", {})
    annotations = meta.setdefault("annotations", {})
    annotations[RUN_ANNOTATION] = placement.run_id
    nodes = sorted({r.node_id for r in replicas})
    if len(replicas) == 1:
        # One pod: its node, rank and GPUs are known now.
        pod.setdefault("nodeSelector", {})[HOSTNAME] = nodes[0]
        annotations[RANK_ANNOTATION] = str(replicas[0].rank)
        annotations[GPUS_ANNOTATION] = ",".join(map(str, replicas[0].gpus))
    else:
        # Several pods share the template: keep them on the role's nodes and gate them
        # until each is pinned to its own replica's node.
        _require_nodes(pod, nodes)
        gates = pod.setdefault("schedulingGates", [])
        if not any(g.get("name") == GATE for g in gates):
            gates.append({"name": GATE})
    gpus = len(replicas[0].gpus)
    containers = pod.get("containers") or []
    asked = sum(
        int(parse_quantity(((c.get("resources") or {}).get("limits") or {}).get(GPU_RESOURCE))) for c in containers
    )
    if creating:
        # A new object may still be shaped: GPU limits and Trainyard's env.
        if asked != gpus and containers:
            for c in containers:
                (c.get("resources") or {}).get("limits", {}).pop(GPU_RESOURCE, None)
            containers[0].setdefault("resources", {}).setdefault("limits", {})[GPU_RESOURCE] = gpus
        for c in containers:
            rank_ref = {"fieldRef": {"fieldPath": f"metadata.annotations['{RANK_ANNOTATION}']"}}
            _set_env(c, "TRAINYARD_RANK", {"valueFrom": rank_ref})
            _set_env(c, "TRAINYARD_WORLD_SIZE", {"value": str(world)})
            _set_env(c, "TRAINYARD_ROLE", {"value": replicas[0].role})
            _set_env(c, "TRAINYARD_RUN_ID", {"value": placement.run_id})
    elif asked != gpus:
        # An existing object's resources cannot change; a mismatch would run on the wrong GPUs.
        raise BindError(
            f"role {replicas[0].role!r}: containers ask for {asked} {GPU_RESOURCE} per pod "
            f"but each replica was placed on {gpus}; fix the manifest or the job spec"
        )


def _require_nodes(pod: Manifest, nodes: list[str]) -> None:
    """AND ``hostname In nodes`` into the pod's required node affinity."""
    required = (
        pod.setdefault("affinity", {})
        .setdefault("nodeAffinity", {})
        .setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    )
    terms = required.setdefault("nodeSelectorTerms", [])
    expression = {"key": HOSTNAME, "operator": "In", "values": nodes}
    if not terms:
        terms.append({"matchExpressions": [expression]})
    for term in terms:  # terms are ORed, so every term must carry the expression
        kept = [e for e in term.get("matchExpressions") or [] if e.get("key") != HOSTNAME]
        term["matchExpressions"] = [*kept, expression]


def _set_env(container: Manifest, name: str, value: dict[str, Any]) -> None:
    env = [e for e in container.get("env") or [] if e.get("name") != name]
    env.append({"name": name, **value})
    container["env"] = env


def pin_pod(pod: Manifest, placement: Placement, manifest: Manifest) -> Manifest | None:
    """A copy of a gated pod pinned to its replica's node, rank and GPUs; ``None`` if not ours."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    if not any(g.get("name") == GATE for g in spec.get("schedulingGates") or []):
        return None
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    completion = int(labels.get(COMPLETION_INDEX, annotations.get(COMPLETION_INDEX, 0)))
    if manifest.get("kind") == "JobSet":
        role = labels.get(ROLE_LABEL)
        rj = next((r for r in manifest["spec"].get("replicatedJobs") or [] if r.get("name") == role), None)
        if rj is None:
            return None
        per_job = _pods_per_job(rj.get("template", {}).get("spec", {}))
        replica = int(labels.get(JOB_INDEX_LABEL, 0)) * per_job + completion
    else:
        roles = {r.role for r in placement.replicas}
        if len(roles) != 1:
            return None
        (role,) = roles
        replica = completion
    mine = next((r for r in placement.replicas if r.role == role and r.replica == replica), None)
    if mine is None:
        raise BindError(f"pod {meta.get('name')!r} is replica {replica} of role {role!r}, which the placement lacks")
    out = copy.deepcopy(pod)
    out_spec = out["spec"]
    out_spec.setdefault("nodeSelector", {})[HOSTNAME] = mine.node_id
    out_spec["schedulingGates"] = [g for g in out_spec.get("schedulingGates") or [] if g.get("name") != GATE]
    out_annotations = out.setdefault("metadata", {}).setdefault("annotations", {})
    out_annotations[RANK_ANNOTATION] = str(mine.rank)
    out_annotations[GPUS_ANNOTATION] = ",".join(map(str, mine.gpus))
    out_annotations[RUN_ANNOTATION] = placement.run_id
    return out


# --- which object a job runs as, and whether it still needs binding ---

WORKLOAD_SCHEME = "kube:"
_KINDS = ("Job", "JobSet")
_DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


def workload_object(workload_ref: str | None) -> tuple[str, str, str]:
    """``kube:Job/team-a/train`` -> ``("Job", "team-a", "train")``: the suspended
    Job or JobSet a job's ``workload_ref`` names."""
    ref = workload_ref or ""
    kind, _, path = ref.removeprefix(WORKLOAD_SCHEME).partition("/")
    namespace, _, name = path.partition("/")
    if (
        not ref.startswith(WORKLOAD_SCHEME)
        or kind not in _KINDS
        or not all(_DNS_NAME.match(part) for part in (namespace, name))
    ):
        raise BindError(
            f"workload_ref {ref!r} names no Kubernetes object; write kube:Job/NAMESPACE/NAME or "
            "kube:JobSet/NAMESPACE/NAME for a suspended object labelled trainyard.io/queue"
        )
    return kind, namespace, name


def needs_bind(manifest: Manifest, placement: Placement) -> bool:
    """Whether the object still waits for this run's placement; raises when it
    already runs another run (two placements for one object)."""
    if (manifest.get("spec") or {}).get("suspend") is True:
        return True
    bound_to = ((manifest.get("metadata") or {}).get("annotations") or {}).get(RUN_ANNOTATION)
    if bound_to == placement.run_id:
        return False
    meta = manifest.get("metadata") or {}
    raise BindError(
        f"{manifest.get('kind', '?')} {meta.get('name', '?')!r} is not suspended and is bound to run {bound_to!r}, "
        f"not {placement.run_id!r}; suspend it (or create a new object) so Trainyard can place it"
    )


_SUFFIX = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "m": 10**-3,
}


def parse_quantity(value: str | int | float | None) -> float:
    """A Kubernetes resource quantity (``96``, ``95500m``, ``2Ti``) as a number."""
    if value is None:
        return 0.0
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value).strip()
    for suffix in sorted(_SUFFIX, key=len, reverse=True):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * _SUFFIX[suffix]
    return float(text)
