"""Builders for placement tests: ``nodes(16, gpus=8, rack="r1")``, ``job(replicas=4)``."""

from __future__ import annotations

from trainyard.core.placement import (
    ClusterSnapshot,
    NodeView,
    PlacementPolicy,
    PlacementRequest,
    PlacementResult,
    RunningAlloc,
)
from trainyard.domain.job import JobSpec, Role, TopologyConstraint, TopologyLevel
from trainyard.domain.node import NodeInfo
from trainyard.events.jobs import ReplicaPlacement


def nodes(
    n: int,
    gpus: int = 8,
    rack: str = "r1",
    block: str = "b1",
    zone: str = "z1",
    gpu_type: str = "H100",
    nvlink: str | None = None,
    free: int | None = None,
    schedulable: bool = True,
    name: str | None = None,
) -> list[NodeView]:
    """``n`` nodes in one rack; ``free`` GPUs free on each (all by default)."""
    prefix = name or f"{zone}-{block}-{rack}{'-' + nvlink if nvlink else ''}-n"
    count = gpus if free is None else free
    return [
        NodeView(
            NodeInfo(f"{prefix}{i:02d}", "c1", gpu_type, gpus, zone=zone, block=block, rack=rack, nvlink_domain=nvlink),
            tuple(range(gpus - count, gpus)),
            schedulable,
        )
        for i in range(n)
    ]


def role(
    name: str = "worker",
    replicas: int = 1,
    gpus: int = 8,
    level: str | None = None,
    required: bool = True,
    gpu_type: str = "H100",
) -> Role:
    topology = TopologyConstraint(TopologyLevel(level), required) if level else None
    return Role(name, replicas=replicas, gpus_per_replica=gpus, gpu_type=gpu_type, topology=topology)


def job(
    replicas: int = 1,
    gpus: int = 8,
    roles: list[Role] | None = None,
    level: str | None = None,
    required: bool = True,
    max_runtime_s: int = 3600,
    gpu_type: str = "H100",
) -> JobSpec:
    topology = TopologyConstraint(TopologyLevel(level), required) if level else None
    return JobSpec(
        tenant="t",
        queue="q",
        roles=roles or [role(replicas=replicas, gpus=gpus, gpu_type=gpu_type)],
        topology=topology,
        max_runtime_s=max_runtime_s,
        image="trainer:1",
    )


def request(spec: JobSpec, job_id: str = "j1", order: int = 0) -> PlacementRequest:
    return PlacementRequest(job_id=job_id, run_id=f"{job_id}-run1", spec=spec, order=order)


def snapshot(
    *groups: list[NodeView], running: list[RunningAlloc] | None = None, policy: PlacementPolicy | None = None
) -> ClusterSnapshot:
    views = [v for g in groups for v in g]
    return ClusterSnapshot(nodes=views, running=running or [], policy=policy or PlacementPolicy())


def holding(
    job_id: str,
    where: dict[str, list[int]],
    started_at: float = 0.0,
    max_runtime_s: float = 3600,
    preemptible: bool = False,
    last_checkpoint_at: float | None = None,
) -> RunningAlloc:
    """A running job holding ``where`` (node id -> GPU indices)."""
    replicas = [
        ReplicaPlacement(role="worker", replica=i, rank=i, node_id=node_id, gpus=list(g))
        for i, (node_id, g) in enumerate(sorted(where.items()))
    ]
    return RunningAlloc(job_id, f"{job_id}-run1", replicas, started_at, max_runtime_s, preemptible, last_checkpoint_at)


def busy(views: list[NodeView]) -> list[NodeView]:
    """The same nodes with no GPU free."""
    return [NodeView(v.info, (), v.schedulable) for v in views]


def infos(snap: ClusterSnapshot) -> dict[str, NodeInfo]:
    return {v.info.node_id: v.info for v in snap.nodes}


def placed_nodes(result: PlacementResult, job_id: str = "j1") -> list[str]:
    (p,) = [p for p in result.placements if p.job_id == job_id]
    return [r.node_id for r in p.replicas]


def racks(result: PlacementResult, snap: ClusterSnapshot, job_id: str = "j1") -> set[str]:
    by_id = infos(snap)
    return {by_id[n].rack for n in placed_nodes(result, job_id)}
