"""Topology-aware preemption: free one domain that holds the gang, losing the least work.

Admission decides *whether* a job may preempt and which runs it may stop;
placement decides *which* of those to stop.  Stopping runs scattered over the
cluster frees GPUs the gang cannot use together, so victims are chosen per
domain: for every domain the waiting gang could use, the cheapest runs in it
are stopped until the gang fits there, then any run that turns out not to be
needed is spared.  The cheapest domain wins; a run's cost is the work lost
since its last checkpoint plus its restart cost (``restart_cost_s`` per GPU:
start-up, reloading the checkpoint, warming up), in GPU-seconds.

A caller that asks for several gangs in one cycle (admission) builds the
topology once and passes it in: each call then costs in proportion to the
candidates and the domains they touch, not to the whole cluster, and leaves
the topology as it found it.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from trainyard.core.placement.cycle import build_topology
from trainyard.core.placement.gang import fit_gang, undo, widest_level
from trainyard.core.placement.probe import Probe
from trainyard.core.placement.snapshot import ClusterSnapshot, PlacementRequest, RunningAlloc
from trainyard.core.placement.topology import Level, Node, Topology
from trainyard.domain.job import JobSpec
from trainyard.events.jobs import ReplicaPlacement


class VictimSet(msgspec.Struct, frozen=True):
    """Runs to stop so that a gang can start, and where it would then run."""

    job_id: str
    run_id: str
    victims: list[str]  # run ids to preempt, cheapest first
    lost_gpu_seconds: float  # work since the victims' last checkpoints
    level: str  # "node", "nvlink", "rack", "block", "zone" or "cluster"
    domain: str  # key of the domain freed, e.g. "z1/b2/r7"
    replicas: list[ReplicaPlacement]  # the gang's placement once the victims have stopped
    cost_gpu_seconds: float = 0.0  # what the choice was priced at: lost work plus restart cost


def select_victims(
    snapshot: ClusterSnapshot,
    request: PlacementRequest,
    preemptible_candidates: list[RunningAlloc],
    now: float,
    topology: Topology | None = None,
    restart_cost_s: float = 0.0,
) -> VictimSet | None:
    """The cheapest set of candidates whose stopping lets the gang start in one domain.

    Returns a set with no victims when the gang fits already, and ``None``
    when stopping every candidate would still not make room.  ``topology``:
    the snapshot's topology already built (and perhaps updated since) by the
    caller; it is used as is and left unchanged.  ``restart_cost_s``: seconds
    per GPU a stopped run spends getting back to where it was, added to its
    lost work.
    """
    topo = topology if topology is not None else build_topology(snapshot)
    limit = snapshot.policy.candidates_per_level
    spec = request.spec
    # 1. Nothing to stop if the gang fits now.
    probe = Probe(topo, spec)  # the gang's aggregate check, narrowed to each domain tried
    now_fit = None if probe.now() is False else fit_gang(topo, spec, limit)
    if now_fit is not None:
        undo(topo, [(0, "", topo.nodes[r.node_id], r.gpus) for r in now_fit])
        return VictimSet(request.job_id, request.run_id, [], 0.0, "cluster", "*", now_fit)
    primary = min(spec.gpu_types)
    tree = topo.trees.get(primary)
    if tree is None:
        return None

    def cost(v: RunningAlloc) -> float:
        return v.lost_gpu_seconds(now) + restart_cost_s * v.gpus

    # 2. Each candidate's GPUs on schedulable nodes and the domains it touches.
    victims = sorted(
        (v for v in preemptible_candidates if any(r.node_id in topo.nodes for r in v.replicas)),
        key=lambda v: (cost(v), v.run_id),
    )
    touched: dict[tuple[Level, str], list[RunningAlloc]] = {}  # domain -> candidates in it, cheapest first
    held: dict[tuple[Level, str], int] = {}  # domain -> GPUs of the primary type its candidates hold there
    for v in victims:
        keys: set[tuple[Level, str]] = set()
        for r in v.replicas:
            node = topo.nodes.get(r.node_id)
            if node is None:
                continue
            primary_node = node.info.gpu_type == primary
            for d in node.chain:
                where = (d.level, d.key)
                keys.add(where)
                if primary_node:
                    held[where] = held.get(where, 0) + len(r.gpus)
        for where in keys:
            touched.setdefault(where, []).append(v)
    need = spec.gpus_by_type.get(primary, 0)
    widest = widest_level(spec)
    best: tuple[float, Level, str, list[RunningAlloc], list[ReplicaPlacement]] | None = None
    # 3. Per domain (tightest level first, then by key): stop the cheapest runs in it until the gang fits there.
    for level in Level:
        if level > widest or (level is Level.CLUSTER and best is not None):
            break
        for (lvl, key), inside in sorted(touched.items()):
            if lvl != level:
                continue
            domain = tree.levels[level].get(key)
            if domain is None and level is not Level.NODE:
                continue
            # Domains that cannot win are skipped without trying them: one too small for the gang even with
            # every candidate in it stopped, or one whose cheapest candidate alone costs what the best costs
            # (every domain needs a victim, since the gang fits nowhere now, and a tie goes to the domain
            # met first).
            if domain is not None and domain.free + held.get((lvl, key), 0) < need:
                continue
            if best is not None and cost(inside[0]) >= best[0]:
                continue
            found = _free_domain(topo, spec, probe.inside(level, key), level, key, inside, cost, limit)
            if found is None:
                continue
            price, chosen, plan = found
            if best is None or (price, level, key) < (best[0], best[1], best[2]):
                best = (price, level, key, chosen, plan)
    if best is None:
        return None
    price, level, key, chosen, plan = best
    return VictimSet(
        job_id=request.job_id,
        run_id=request.run_id,
        victims=[v.run_id for v in chosen],
        lost_gpu_seconds=sum(v.lost_gpu_seconds(now) for v in chosen),
        level=Level(level).name.lower(),
        domain=key,
        replicas=plan,
        cost_gpu_seconds=price,
    )


def _free_domain(
    topo: Topology,
    spec: JobSpec,
    probe: Probe,
    level: Level,
    key: str,
    inside: list[RunningAlloc],
    cost: Callable[[RunningAlloc], float],
    limit: int,
) -> tuple[float, list[RunningAlloc], list[ReplicaPlacement]] | None:
    released: list[tuple[RunningAlloc, list[tuple[Node, list[int]]]]] = []
    plan = None  # where the gang goes: packed only once the victims are known, when the aggregates tell
    try:
        for v in inside:  # cheapest first
            released.append((v, _release(topo, v)))
            fit, plan = _fits(topo, spec, probe, level, key, limit)
            if fit:
                break
        else:
            return None
        # Spare any run the gang turns out not to need, the costliest first.
        for v, given in sorted(released, key=lambda p: (-cost(p[0]), p[0].run_id)):
            if len(released) == 1:
                break
            for node, gpus in given:
                topo.take(node, gpus)
            fit, again = _fits(topo, spec, probe, level, key, limit)
            if not fit:
                for node, gpus in given:
                    topo.give(node, gpus)
            else:
                plan = again  # None while the aggregates answer: packed below
                released.remove((v, given))
        if plan is None:
            plan = _pack(topo, spec, level, key, limit)  # the aggregates said it fits: packing agrees
            if plan is None:
                return None
        chosen = sorted((v for v, _ in released), key=lambda v: (cost(v), v.run_id))
        return sum(cost(v) for v in chosen), chosen, plan
    finally:
        for _, given in released:
            for node, gpus in given:
                topo.take(node, gpus)


def _release(topo: Topology, victim: RunningAlloc) -> list[tuple[Node, list[int]]]:
    given = []
    for r in victim.replicas:
        node = topo.nodes.get(r.node_id)
        if node is not None:
            back = topo.give(node, r.gpus)
            if back:
                given.append((node, back))
    return given


def _fits(
    topo: Topology, spec: JobSpec, probe: Probe, level: Level, key: str, limit: int
) -> tuple[bool, list[ReplicaPlacement] | None]:
    """Whether the gang fits the domain now, and where when packing had to tell (the aggregates answer
    exactly for most gangs: those are packed once, when the victims are known)."""
    quick = probe.now()
    if quick is not None:
        return quick, None
    plan = _pack(topo, spec, level, key, limit)
    return plan is not None, plan


def _pack(topo: Topology, spec: JobSpec, level: Level, key: str, limit: int) -> list[ReplicaPlacement] | None:
    plan = fit_gang(topo, spec, limit, within=(level, key))
    if plan is not None:
        undo(topo, [(0, "", topo.nodes[r.node_id], r.gpus) for r in plan])
    return plan
