"""Pure translation of Kubernetes Node objects (plain dicts) into what Trainyard reads:
``node_view_from_k8s`` gives the ``NodeView`` placement reads, from the device
plugin's ``nvidia.com/gpu`` count and the topology labels; ``node_info_from_k8s``
the ``NodeInfo`` a node registers with."""

from __future__ import annotations

import re

from trainyard.core.placement import NodeView
from trainyard.domain.node import NodeInfo
from trainyard.kube.translate import GPU_RESOURCE, Manifest, TopologyLabels, parse_quantity

KNOWN_GPUS = (
    "GB300",
    "GB200",
    "B300",
    "B200",
    "H200",
    "H100",
    "H800",
    "H20",
    "A100",
    "A800",
    "L40S",
    "L40",
    "L4",
    "A10G",
    "A10",
    "T4",
    "V100",
)
_NOT_NAME = re.compile(r"[^A-Za-z0-9_-]+")


def gpu_type_of(product: str | None) -> str:
    """``NVIDIA-H100-80GB-HBM3`` -> ``H100``; unknown products keep a cleaned-up name."""
    if not product:
        return "unknown"
    tokens = re.split(r"[-_ ]+", product.upper())
    for known in KNOWN_GPUS:
        if known in tokens:
            return known
    cleaned = _NOT_NAME.sub("-", product).strip("-_")[:32]
    return cleaned or "unknown"


def node_info_from_k8s(node: Manifest, cluster: str, labels: TopologyLabels = TopologyLabels()) -> NodeInfo | None:
    """The node as placement sees it, or ``None`` when it has no GPUs."""
    meta = node.get("metadata") or {}
    name = meta["name"]
    status = node.get("status") or {}
    resources = status.get("allocatable") or status.get("capacity") or {}
    gpus = int(parse_quantity(resources.get(GPU_RESOURCE)))
    if gpus <= 0:
        return None
    tags = meta.get("labels") or {}
    return NodeInfo(
        node_id=name,
        cluster=cluster,
        gpu_type=gpu_type_of(tags.get(labels.product)),
        gpus=gpus,
        cpu=parse_quantity(resources.get("cpu")) or 1.0,
        memory_gib=parse_quantity(resources.get("memory")) / 2**30 or 1.0,
        zone=tags.get(labels.zone, "default"),
        # Unlabelled nodes claim no locality: each is its own block and rack.
        block=tags.get(labels.block, f"~{name}"),
        rack=tags.get(labels.rack, f"~{name}"),
        nvlink_domain=tags.get(labels.nvlink) or None,
        labels=dict(tags),
    )


def node_schedulable(node: Manifest, labels: TopologyLabels = TopologyLabels()) -> bool:
    """Cordoned, not Ready, or tainted against new work (other than GPU taints) means no."""
    spec = node.get("spec") or {}
    if spec.get("unschedulable"):
        return False
    for taint in spec.get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and taint.get("key") not in labels.tolerated_taints:
            return False
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready" and cond.get("status") != "True":
            return False
    return True


def node_view_from_k8s(
    node: Manifest, cluster: str, used_gpus: tuple[int, ...] = (), labels: TopologyLabels = TopologyLabels()
) -> NodeView | None:
    """A ``NodeView``; ``used_gpus`` are the indices Trainyard's own ledger says are held."""
    info = node_info_from_k8s(node, cluster, labels)
    if info is None:
        return None
    free = tuple(g for g in range(info.gpus) if g not in set(used_gpus))
    return NodeView(info=info, free_gpus=free, schedulable=node_schedulable(node, labels))
