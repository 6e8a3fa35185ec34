"""Properties of every placement cycle, on generated clusters, running jobs and requests.

- no GPU is allocated that does not exist, is not free, or sits on a cordoned node;
- no GPU is given twice;
- a gang is placed whole (every replica of every role, with its GPUs) or not at all;
- required topology constraints, of the job and of each role, always hold;
- backfill never delays a reservation: every reserved GPU is free by the
  reservation's start, and no job placed in the cycle holds one past it;
- a reservation starts at the earliest release after which the gang fits (for
  gangs the aggregates answer exactly), and its search leaves the tree as it was.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainyard.core.placement import (
    ClusterSnapshot,
    NodeView,
    PlacementPolicy,
    PlacementRequest,
    RunningAlloc,
    place,
    select_victims,
)
from trainyard.core.placement.backfill import Backfill
from trainyard.core.placement.cycle import build_topology
from trainyard.core.placement.gang import fit_gang, undo
from trainyard.core.placement.probe import Probe
from trainyard.core.placement.topology import LEVEL_OF, Level, domain_key
from trainyard.domain.job import JobSpec, Role, TopologyConstraint, TopologyLevel
from trainyard.domain.node import NodeInfo
from trainyard.events.jobs import ReplicaPlacement

NOW = 1_000.0
LEVELS = [None, TopologyLevel.NVLINK, TopologyLevel.RACK, TopologyLevel.BLOCK]


@st.composite
def clusters(draw) -> ClusterSnapshot:
    views: list[NodeView] = []
    running: list[RunningAlloc] = []
    n_nodes = draw(st.integers(1, 14))
    for i in range(n_nodes):
        gpus = draw(st.sampled_from([4, 8]))
        block = draw(st.sampled_from(["b1", "b2"]))
        rack = draw(st.sampled_from(["r1", "r2", "r3"]))
        nvlink = draw(st.sampled_from([None, None, "nv1", "nv2"]))
        gpu_type = draw(st.sampled_from(["H100", "H100", "H100", "L40S"]))
        info = NodeInfo(f"n{i:02d}", "c1", gpu_type, gpus, block=block, rack=rack, nvlink_domain=nvlink)
        held = draw(st.lists(st.integers(0, gpus - 1), unique=True, max_size=gpus))
        free = tuple(g for g in range(gpus) if g not in held)
        views.append(NodeView(info, free, draw(st.booleans().map(lambda b: b or draw(st.booleans())))))
        # Held GPUs belong to one or two running jobs with known limits.
        cut = draw(st.integers(0, len(held)))
        for j, part in enumerate((held[:cut], held[cut:])):
            if part:
                running.append(
                    RunningAlloc(
                        f"run-n{i}-{j}",
                        f"run-n{i}-{j}-r",
                        [ReplicaPlacement("w", 0, 0, info.node_id, sorted(part))],
                        started_at=NOW - draw(st.integers(0, 500)),
                        max_runtime_s=draw(st.integers(100, 2000)),
                        preemptible=draw(st.booleans()),
                        last_checkpoint_at=NOW - draw(st.integers(0, 300)),
                    )
                )
    policy = PlacementPolicy(max_reservations=draw(st.integers(0, 3)), candidates_per_level=draw(st.integers(1, 8)))
    return ClusterSnapshot(nodes=views, running=running, policy=policy)


@st.composite
def specs(draw) -> JobSpec:
    roles = []
    for r in range(draw(st.integers(1, 2))):
        level = draw(st.sampled_from(LEVELS))
        roles.append(
            Role(
                f"role{r}",
                replicas=draw(st.integers(1, 5)),
                gpus_per_replica=draw(st.sampled_from([1, 2, 4, 8])),
                gpu_type=draw(st.sampled_from(["H100", "H100", "L40S"])),
                topology=TopologyConstraint(level, draw(st.booleans())) if level else None,
            )
        )
    level = draw(st.sampled_from(LEVELS + [TopologyLevel.ZONE]))
    topology = TopologyConstraint(level, draw(st.booleans())) if level else None
    return JobSpec("t", "q", roles, topology=topology, max_runtime_s=draw(st.integers(10, 3000)), image="x")


def requests_of(spec_list: list[JobSpec]) -> list[PlacementRequest]:
    return [PlacementRequest(f"j{i}", f"j{i}-r", s, i) for i, s in enumerate(spec_list)]


def same_domain(infos: list[NodeInfo], level: TopologyLevel) -> bool:
    return len({domain_key(i, LEVEL_OF[level]) for i in infos}) <= 1


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snap=clusters(), spec_list=st.lists(specs(), min_size=1, max_size=6))
def test_every_cycle_keeps_the_allocation_invariants(snap, spec_list):
    reqs = requests_of(spec_list)
    result = place(snap, reqs, NOW)
    views = {v.info.node_id: v for v in snap.nodes}
    by_job = {r.job_id: r for r in reqs}
    # Every request is answered exactly once.
    answered = [p.job_id for p in result.placements] + [u.job_id for u in result.unplaced]
    assert sorted(answered) == sorted(by_job)
    taken: set[tuple[str, int]] = set()
    for p in result.placements:
        spec = by_job[p.job_id].spec
        # The gang is whole: every replica of every role, each with its GPUs.
        assert sorted(r.rank for r in p.replicas) == list(range(spec.replica_count))
        for role in spec.roles:
            mine = [r for r in p.replicas if r.role == role.name]
            assert sorted(r.replica for r in mine) == list(range(role.replicas))
            for r in mine:
                view = views[r.node_id]
                assert view.schedulable and view.info.gpu_type == role.gpu_type
                assert len(r.gpus) == len(set(r.gpus)) == role.gpus_per_replica
                for g in r.gpus:
                    assert g in view.free_gpus  # exists and was free
                    assert (r.node_id, g) not in taken  # never given twice
                    taken.add((r.node_id, g))
            if role.topology is not None and role.topology.required:
                assert same_domain([views[r.node_id].info for r in mine], role.topology.level)
        if spec.topology is not None and spec.topology.required:
            assert same_domain([views[r.node_id].info for r in p.replicas], spec.topology.level)
    # Reservations are never delayed by what the cycle placed.
    assert len(result.reservations) <= snap.policy.max_reservations
    ends = {a.run_id: max(a.expected_end, NOW) for a in snap.running}
    holder = {(r.node_id, g): a.run_id for a in snap.running for r in a.replicas for g in r.gpus}
    seen: set[tuple[str, int]] = set()
    for res in result.reservations:
        assert res.job_id not in {p.job_id for p in result.placements}
        for r in res.replicas:
            for g in r.gpus:
                key = (r.node_id, g)
                assert key not in seen  # reservations do not overlap
                seen.add(key)
                if g in views[r.node_id].free_gpus:
                    continue
                assert key in holder and ends[holder[key]] <= res.start_at
        for p in result.placements:
            end = NOW + by_job[p.job_id].spec.max_runtime_s
            if end > res.start_at:
                assert not {(r.node_id, g) for r in p.replicas for g in r.gpus} & {
                    (r.node_id, g) for r in res.replicas for g in r.gpus
                }


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snap=clusters(), spec=specs())
def test_victims_are_candidates_and_make_room_in_one_domain(snap, spec):
    candidates = [a for a in snap.running if a.preemptible]
    req = PlacementRequest("p", "p-r", spec, 0)
    chosen = select_victims(snap, req, candidates, NOW)
    if chosen is None:
        return
    assert set(chosen.victims) <= {a.run_id for a in candidates}
    stopped = {(r.node_id, g) for a in candidates if a.run_id in chosen.victims for r in a.replicas for g in r.gpus}
    views = {v.info.node_id: v for v in snap.nodes}
    used = set()
    for r in chosen.replicas:
        assert views[r.node_id].schedulable
        for g in r.gpus:
            assert g in views[r.node_id].free_gpus or (r.node_id, g) in stopped
            assert (r.node_id, g) not in used
            used.add((r.node_id, g))
    if chosen.level not in ("cluster", "node"):
        level = Level[chosen.level.upper()]
        assert {domain_key(views[r.node_id].info, level) for r in chosen.replicas} == {chosen.domain}
    if spec.topology is not None and spec.topology.required:
        assert same_domain([views[r.node_id].info for r in chosen.replicas], spec.topology.level)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snap=clusters(), spec=specs())
def test_the_aggregate_check_agrees_with_packing_where_it_claims_to_be_exact(snap, spec):
    topo = build_topology(snap)
    quick = Probe(topo, spec).now()
    placed = fit_gang(topo, spec, snap.policy.candidates_per_level)
    if quick is not None:
        assert quick == (placed is not None)


@st.composite
def exact_specs(draw) -> JobSpec:
    """Gangs the aggregate check answers exactly: one role without a constraint of its own."""
    role = Role(
        "w",
        replicas=draw(st.integers(1, 5)),
        gpus_per_replica=draw(st.sampled_from([1, 2, 4, 8])),
        gpu_type=draw(st.sampled_from(["H100", "H100", "L40S"])),
    )
    level = draw(st.sampled_from(LEVELS + [TopologyLevel.ZONE]))
    topology = TopologyConstraint(level, draw(st.booleans())) if level else None
    return JobSpec("t", "q", [role], topology=topology, image="x")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snap=clusters(), spec=st.one_of(exact_specs(), specs()))
def test_the_aggregate_check_within_a_domain_agrees_with_packing_there(snap, spec):
    topo = build_topology(snap)
    domains = {(level, key) for tree in topo.trees.values() for level, index in tree.levels.items() for key in index}
    for within in sorted(domains) + [(Level.RACK, "no such rack")]:
        quick = Probe(topo, spec, within).now()
        placed = fit_gang(topo, spec, snap.policy.candidates_per_level, within=within)
        if placed is not None:
            undo(topo, [(0, "", topo.nodes[r.node_id], r.gpus) for r in placed])
        if quick is not None:
            assert quick == (placed is not None), within


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snap=clusters(), spec=specs())
def test_the_probe_agrees_with_the_aggregate_check_as_gpus_come_back(snap, spec):
    topo = build_topology(snap)
    probe = Probe(topo, spec)
    if not probe.exact:
        assert Probe(topo, spec).now() is None
        return
    before = bool(Probe(topo, spec).now())
    for alloc in sorted(snap.running, key=lambda a: a.expected_end):
        changed = []
        for r in alloc.replicas:
            node = topo.nodes.get(r.node_id)
            if node is not None and topo.give(node, r.gpus):
                changed.append(node)
        now = bool(Probe(topo, spec).now())
        if not before:
            assert probe.after(changed) == now
        assert now or not before  # GPUs only came back: what fitted still fits
        before = now


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snap=clusters(), spec=specs())
def test_a_reservation_starts_at_the_earliest_release_after_which_the_gang_fits(snap, spec):
    topo = build_topology(snap)
    free_before = {n.key: list(n.free_gpus) for n in topo.nodes.values()}
    backfill = Backfill(topo, NOW, snap.running)
    reservation = backfill.reserve("j", "j-r", spec, snap.policy.candidates_per_level)
    backfill.unmask()  # the reserved GPUs, kept out of the tree for later jobs, go back
    assert {n.key: n.free_gpus for n in topo.nodes.values()} == free_before  # the search left the tree as it was
    if not Probe(build_topology(snap), spec).exact:
        return  # packing decides: searched by bisection, as before
    ordered = sorted(snap.running, key=lambda a: a.expected_end)
    expected = None
    for k in range(1, len(ordered) + 1):  # every prefix of the releases, on a fresh tree
        fresh = build_topology(snap)
        for alloc in ordered[:k]:
            for r in alloc.replicas:
                if r.node_id in fresh.nodes:
                    fresh.give(fresh.nodes[r.node_id], r.gpus)
        if fit_gang(fresh, spec, snap.policy.candidates_per_level) is not None:
            expected = max(ordered[k - 1].expected_end, NOW)
            break
    assert (reservation.start_at if reservation is not None else None) == expected
