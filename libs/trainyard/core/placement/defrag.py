"""Defragmentation proposals: move preemptible runs so that whole racks come free.

Off by default: nothing in ``place`` calls this.  An operator or a policy
loop may call ``propose_moves`` and act on the result (checkpoint, stop and
re-place the runs named).  Only racks whose every holder is preemptible and
lies wholly inside the rack are considered, and a rack is proposed only when
every one of its runs fits elsewhere without touching another candidate rack.
"""

from __future__ import annotations

import msgspec

from trainyard.core.placement.cycle import build_topology
from trainyard.core.placement.gang import fit_gang
from trainyard.core.placement.snapshot import ClusterSnapshot, RunningAlloc
from trainyard.core.placement.topology import Domain, Level, Node, Topology
from trainyard.domain.job import JobSpec, Role
from trainyard.events.jobs import ReplicaPlacement


class Move(msgspec.Struct, frozen=True):
    """Stop ``run_id`` (from its checkpoint) and run it again at ``to``."""

    job_id: str
    run_id: str
    rack: str  # the rack this move helps to free
    lost_gpu_seconds: float
    to: list[ReplicaPlacement]


def propose_moves(snapshot: ClusterSnapshot, now: float, max_racks: int = 1) -> list[Move]:
    """Moves that free up to ``max_racks`` racks, cheapest racks first."""
    topo = build_topology(snapshot)
    on_node: dict[str, list[RunningAlloc]] = {}
    for alloc in snapshot.running:
        for r in alloc.replicas:
            on_node.setdefault(r.node_id, []).append(alloc)
    candidates: list[tuple[float, int, str, Domain, list[RunningAlloc]]] = []
    for gpu_type, tree in sorted(topo.trees.items()):
        for rack in tree.domains(Level.RACK):
            if rack.free == rack.capacity or rack.free == 0:
                continue
            holders = _holders(rack, on_node)
            if holders is None:
                continue
            cost = sum(a.lost_gpu_seconds(now) for a in holders)
            candidates.append((cost, rack.capacity - rack.free, f"{gpu_type}:{rack.key}", rack, holders))
    candidates.sort(key=lambda c: (c[0], c[1], c[2]))
    moves: list[Move] = []
    freed = 0
    for _, _, _, rack, holders in candidates:
        if freed >= max_racks:
            break
        planned = _relocate(topo, rack, holders, now)
        if planned is not None:
            moves.extend(planned)
            freed += 1
    return moves


def _holders(rack: Domain, on_node: dict[str, list[RunningAlloc]]) -> list[RunningAlloc] | None:
    inside = {n.key for n in rack.nodes()}
    found: dict[str, RunningAlloc] = {}
    for node_id in sorted(inside):
        for alloc in on_node.get(node_id, []):
            if not alloc.preemptible or any(r.node_id not in inside for r in alloc.replicas):
                return None
            found[alloc.run_id] = alloc
    if sum(a.gpus for a in found.values()) < rack.capacity - rack.free:
        return None  # some used GPUs have no known holder; they cannot be moved
    return [found[k] for k in sorted(found)]


def _relocate(topo: Topology, rack: Domain, holders: list[RunningAlloc], now: float) -> list[Move] | None:
    # Keep the rack's free GPUs out of reach while its runs look for a new home.
    fenced: list[tuple[Node, list[int]]] = []
    for node in rack.nodes():
        taken = topo.take(node, list(node.free_gpus))
        if taken:
            fenced.append((node, taken))
    placed: list[tuple[RunningAlloc, list[ReplicaPlacement]]] = []
    ok = True
    for alloc in sorted(holders, key=lambda a: (-a.gpus, a.run_id)):
        plan = fit_gang(topo, _spec_of(topo, alloc))
        if plan is None:
            ok = False
            break
        placed.append((alloc, plan))
    if not ok:
        for _, plan in placed:
            for r in plan:
                topo.give(topo.nodes[r.node_id], r.gpus)
        for node, gpus in fenced:
            topo.give(node, gpus)
        return None
    # The runs now hold their new GPUs in our copy; their old GPUs (and the rack) stay fenced.
    return [Move(alloc.job_id, alloc.run_id, rack.key, alloc.lost_gpu_seconds(now), plan) for alloc, plan in placed]


def _spec_of(topo: Topology, alloc: RunningAlloc) -> JobSpec:
    roles: dict[str, Role] = {}
    for r in alloc.replicas:
        node = topo.nodes[r.node_id]
        old = roles.get(r.role)
        gpus = max(len(r.gpus), old.gpus_per_replica if old else 0)
        count = (old.replicas + 1) if old else 1
        roles[r.role] = Role(r.role, replicas=count, gpus_per_replica=gpus, gpu_type=node.info.gpu_type)
    return JobSpec(tenant="defrag", queue="defrag", roles=list(roles.values()))
