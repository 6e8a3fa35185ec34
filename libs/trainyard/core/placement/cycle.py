"""One placement cycle: put each admitted gang on free GPUs, all or nothing.

The walking-skeleton policy is best fit per replica (the node with the fewest
free GPUs that still holds the replica), which keeps whole nodes free for large
replicas.  Ranks follow node order so consecutive ranks share a node.
"""

from __future__ import annotations

import msgspec

from trainyard.core.reasons import PendingReason
from trainyard.domain.job import JobSpec
from trainyard.domain.node import NodeInfo
from trainyard.events.jobs import ReplicaPlacement


class NodeView(msgspec.Struct, frozen=True):
    info: NodeInfo
    free_gpus: tuple[int, ...]  # indices of GPUs not held by any run
    schedulable: bool = True


class ClusterSnapshot(msgspec.Struct, frozen=True):
    nodes: list[NodeView]


class PlacementRequest(msgspec.Struct, frozen=True):
    job_id: str
    run_id: str
    spec: JobSpec
    order: int  # lower is placed first


class Placement(msgspec.Struct, frozen=True):
    job_id: str
    run_id: str
    replicas: list[ReplicaPlacement]


class Unplaced(msgspec.Struct, frozen=True):
    job_id: str
    run_id: str
    reason: PendingReason


class PlacementResult(msgspec.Struct, frozen=True):
    placements: list[Placement]
    unplaced: list[Unplaced]


def place(snapshot: ClusterSnapshot, requests: list[PlacementRequest], now: float) -> PlacementResult:
    """Place requests in order; each gang is placed whole or not at all."""
    # 1. Our own copy of free GPUs per schedulable node.
    free: dict[str, list[int]] = {}
    nodes: dict[str, NodeInfo] = {}
    for view in snapshot.nodes:
        if view.schedulable and view.free_gpus:
            free[view.info.node_id] = sorted(view.free_gpus)
            nodes[view.info.node_id] = view.info
    placements: list[Placement] = []
    unplaced: list[Unplaced] = []
    # 2. Gangs in order; a gang that does not fit leaves the free map untouched.
    for req in sorted(requests, key=lambda r: (r.order, r.job_id)):
        trial = {n: list(g) for n, g in free.items()}
        replicas = _fit_gang(req.spec, trial, nodes)
        if replicas is None:
            unplaced.append(Unplaced(req.job_id, req.run_id, _why_not(req.spec, free, nodes)))
            continue
        free = trial
        placements.append(Placement(req.job_id, req.run_id, replicas))
    return PlacementResult(placements=placements, unplaced=unplaced)


def _fit_gang(
    spec: JobSpec, free: dict[str, list[int]], nodes: dict[str, NodeInfo]
) -> list[ReplicaPlacement] | None:
    chosen: list[tuple[str, str, int, list[int]]] = []
    # Largest replicas first, so they get whole nodes before small ones fill gaps.
    for role in sorted(spec.roles, key=lambda r: -r.gpus_per_replica):
        for replica in range(role.replicas):
            candidates = [
                n for n, g in free.items() if nodes[n].gpu_type == role.gpu_type and len(g) >= role.gpus_per_replica
            ]
            if not candidates:
                return None
            node_id = min(candidates, key=lambda n: (len(free[n]), n))
            gpus = free[node_id][: role.gpus_per_replica]
            free[node_id] = free[node_id][role.gpus_per_replica :]
            chosen.append((node_id, role.name, replica, gpus))
    # Rank order: by node, so consecutive ranks share a node.
    chosen.sort(key=lambda c: (c[0], c[1], c[2]))
    return [
        ReplicaPlacement(role=role, replica=replica, rank=rank, node_id=node_id, gpus=gpus)
        for rank, (node_id, role, replica, gpus) in enumerate(chosen)
    ]


def _why_not(spec: JobSpec, free: dict[str, list[int]], nodes: dict[str, NodeInfo]) -> PendingReason:
    for gpu_type in spec.gpu_types:
        total_free = sum(len(g) for n, g in free.items() if nodes[n].gpu_type == gpu_type)
        needed = sum(r.gpus for r in spec.roles if r.gpu_type == gpu_type)
        if total_free < needed:
            return PendingReason.INSUFFICIENT_GPUS
    return PendingReason.FRAGMENTED
