"""Topology-aware preemption in admission: with the cluster snapshot, victims free one
domain the waiting gang can be placed in, whole jobs at a time, cheapest by lost work
plus restart cost."""

from __future__ import annotations

import pytest
from admission_builders import NOW, job, queue, running, tenancy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainyard.core.admission import AdmissionPolicy, AdmissionResult, AdmissionSnapshot, admit
from trainyard.core.admission.candidates import Blocked, Candidate, Holder
from trainyard.core.admission.snapshot import PendingJob, RunningJob
from trainyard.core.admission.victims import _enough
from trainyard.core.placement import ClusterSnapshot, NodeView, RunningAlloc, select_victims
from trainyard.core.placement.cycle import build_topology
from trainyard.core.placement.gang import fit_gang
from trainyard.core.placement.snapshot import PlacementRequest
from trainyard.core.reasons import PendingReason as R
from trainyard.domain.job import JobSpec, Role, TopologyConstraint, TopologyLevel
from trainyard.domain.node import NodeInfo
from trainyard.events.jobs import ReplicaPlacement

OWN = {"reclaim": False, "fair_share": False}  # only priority preemption inside the queue
FOUR_NODES = {"n1": "r1", "n2": "r1", "n3": "r2", "n4": "r2"}  # node -> rack, 8 H100 each


def run(
    job_id: str,
    where: dict[str, list[int]] | dict[str, range],
    age: float = 600.0,
    priority: int = 0,
    preemptible: bool = True,
) -> tuple[str, dict[str, list[int]], float, int, bool]:
    """A run holding ``where`` (node -> GPU indices), last checkpointed ``age`` seconds ago."""
    return job_id, {n: list(g) for n, g in where.items()}, age, priority, preemptible


def gang(replicas: int = 1, rack: bool = False) -> JobSpec:
    topology = TopologyConstraint(TopologyLevel.RACK, required=True) if rack else None
    return JobSpec(
        tenant="a", queue="q", roles=[Role("trainer", replicas=replicas, gpus_per_replica=8)], topology=topology
    )


def decide(
    racks: dict[str, str],
    runs: list[tuple],
    spec: JobSpec,
    with_cluster: bool = True,
    restart_cost_s: float = 300.0,
    spec_for: str = "hi",
    asked: list[int] | None = None,
) -> AdmissionResult:
    """One admission cycle with one high-priority waiting gang of queue a/q.

    With ``asked``, the snapshot has no cluster and admission gets it from a callable, which appends to
    ``asked`` each time it is called."""
    held: dict[str, set[int]] = {n: set() for n in racks}
    jobs, allocs = [], []
    for job_id, where, age, priority, preemptible in runs:
        gpus = sum(len(g) for g in where.values())
        jobs.append(running(job_id, gpus, checkpoint=NOW - age, priority=priority, preemptible=preemptible))
        replicas = [ReplicaPlacement("trainer", i, i, n, g) for i, (n, g) in enumerate(sorted(where.items()))]
        allocs.append(
            RunningAlloc(job_id, f"{job_id}-r1", replicas, NOW - 7200, 86_400.0, preemptible, NOW - age, priority)
        )
        for n, g in where.items():
            held[n].update(g)
    nodes = [
        NodeView(NodeInfo(n, "c1", "H100", 8, rack=rack), tuple(g for g in range(8) if g not in held[n]))
        for n, rack in racks.items()
    ]
    capacity = 8 * len(racks)
    in_use = sum(len(g) for g in held.values())
    pending = job("hi", spec.total_gpus, priority=10)
    tree = tenancy(queue("a", H100=(capacity, 0)), restart_cost_s=restart_cost_s, **OWN)
    snapshot = AdmissionSnapshot(
        [pending],
        {"H100": capacity},
        {"H100": in_use},
        jobs,
        cluster=ClusterSnapshot(nodes, allocs) if with_cluster else None,
        specs={spec_for: spec} if with_cluster else {},
    )
    if asked is None:
        return admit(snapshot, AdmissionPolicy(tenancy=tree), NOW)
    cluster, specs = snapshot.cluster, snapshot.specs
    assert cluster is not None

    def lazily() -> tuple[ClusterSnapshot, dict[str, JobSpec]]:
        asked.append(1)
        return cluster, specs

    bare = AdmissionSnapshot(snapshot.pending, snapshot.capacity, snapshot.in_use, snapshot.running)
    return admit(bare, AdmissionPolicy(tenancy=tree), NOW, cluster=lazily)


def victims(result: AdmissionResult) -> set[str]:
    return {p.job_id for p in result.preemptions}


# Rack r1 holds an expensive run on n1 and a cheap half-node run on n2; rack r2 mirrors it, slightly cheaper.
SCATTERED = [
    run("r1-big", {"n1": range(8)}, age=3000),
    run("cheap-1", {"n2": range(4)}, age=10),
    run("cheap-2", {"n3": range(4)}, age=10),
    run("r2-big", {"n4": range(8)}, age=2000),
]
# The only preemptible runs sit in different racks; production holds the rest.
SPLIT = [
    run("prod-1", {"n1": range(8)}, preemptible=False),
    run("lo-a", {"n2": range(8)}),
    run("prod-2", {"n3": range(8)}, preemptible=False),
    run("lo-b", {"n4": range(8)}),
]
# A 2-node gang spans both racks; single-node runs fill the rest.
GANG_VICTIM = [
    run("lo-gang", {"n1": range(8), "n3": range(8)}, age=100),
    run("lo-2", {"n2": range(8)}, age=2000),
    run("lo-4", {"n4": range(8)}, age=3000),
]
# n1: one 8-GPU run that checkpointed 10 s ago; n2: 6 GPUs free and a 2-GPU run 100 s past its checkpoint.
WIDE_OR_NARROW = [run("wide", {"n1": range(8)}, age=10), run("narrow", {"n2": [6, 7]}, age=100)]


@pytest.mark.parametrize(
    "racks, runs, spec, restart_cost_s, expected",
    [
        pytest.param(
            FOUR_NODES,
            SCATTERED,
            gang(2, rack=True),
            300.0,
            {"cheap-2", "r2-big"},
            id="a gang of 2 nodes frees one rack rather than scattered GPUs in two",
        ),
        pytest.param(
            FOUR_NODES,
            SPLIT,
            gang(2, rack=True),
            300.0,
            set(),
            id="no victims when the freed GPUs could not hold the gang",
        ),
        pytest.param(FOUR_NODES, GANG_VICTIM, gang(1), 300.0, {"lo-gang"}, id="a gang victim is preempted whole"),
        pytest.param(
            FOUR_NODES,
            GANG_VICTIM[:1] + [run("lo-2", {"n2": range(8)}, age=150)] + GANG_VICTIM[2:],
            gang(1),
            0.0,
            {"lo-2"},
            id="a gang victim is priced whole: a single-node run that loses less in all goes instead",
        ),
        pytest.param(
            {"n1": "r1", "n2": "r1"},
            WIDE_OR_NARROW,
            gang(1),
            300.0,
            {"narrow"},
            id="the cheaper domain wins counting restart cost",
        ),
        pytest.param(
            {"n1": "r1", "n2": "r1"},
            WIDE_OR_NARROW,
            gang(1),
            0.0,
            {"wide"},
            id="without restart cost the run that lost the least work goes",
        ),
    ],
)
def test_victims_free_one_domain_the_gang_can_use(racks, runs, spec, restart_cost_s, expected):
    result = decide(racks, runs, spec, restart_cost_s=restart_cost_s)
    assert victims(result) == expected
    assert {p.preemptor for p in result.preemptions} <= {"hi"}
    [waiting] = result.waiting
    assert (waiting.reason is R.PREEMPTING) == bool(expected)


def test_without_the_cluster_victims_are_chosen_by_gpu_counts_as_before():
    assert victims(decide(FOUR_NODES, SCATTERED, gang(2, rack=True), with_cluster=False)) == {"cheap-1", "cheap-2"}
    assert victims(decide(FOUR_NODES, SPLIT, gang(2, rack=True), with_cluster=False)) == {"lo-a", "lo-b"}


@pytest.mark.parametrize("runs", [SCATTERED, SPLIT, GANG_VICTIM], ids=["scattered", "split", "gang victim"])
def test_a_cluster_given_lazily_is_asked_for_only_when_counts_would_preempt(runs):
    asked: list[int] = []
    lazy = decide(FOUR_NODES, runs, gang(2, rack=True), asked=asked)
    # counts would preempt in every world here: the decision is the one on the cluster, asked for once
    assert asked == [1]
    assert lazy == decide(FOUR_NODES, runs, gang(2, rack=True))


def test_a_cluster_given_lazily_is_not_asked_for_when_counts_would_not_preempt():
    nobody = [run("prod", {"n1": range(8)}, preemptible=False), run("prod-2", {"n2": range(8)}, preemptible=False)]
    asked: list[int] = []
    lazy = decide({"n1": "r1", "n2": "r1"}, nobody, gang(1), asked=asked)
    assert asked == []
    assert lazy == decide({"n1": "r1", "n2": "r1"}, nobody, gang(1), with_cluster=False)
    assert lazy.waiting and not lazy.preemptions


def test_a_gang_victims_lost_work_counts_every_gpu_it_holds():
    [notice] = decide(FOUR_NODES, GANG_VICTIM, gang(1)).preemptions
    assert notice.job_id == "lo-gang" and notice.lost_gpu_seconds == pytest.approx(16 * 100.0)


def test_a_waiting_job_whose_spec_is_not_given_does_not_preempt():
    result = decide(FOUR_NODES, SCATTERED, gang(2, rack=True), spec_for="another-job")
    assert victims(result) == set()
    assert [w.reason for w in result.waiting] != [R.PREEMPTING]


def test_a_prebuilt_topology_is_reused_and_left_as_it_was():
    nodes = [NodeView(NodeInfo(n, "c1", "H100", 8, rack=r), ()) for n, r in FOUR_NODES.items()]
    allocs = [
        RunningAlloc(
            f"j{n}", f"j{n}-r1", [ReplicaPlacement("t", 0, 0, n, list(range(8)))], NOW - 100, 3600.0, True, NOW - i
        )
        for i, n in enumerate(FOUR_NODES)
    ]
    cluster = ClusterSnapshot(nodes, allocs)
    topo = build_topology(cluster)
    before = {n: list(node.free_gpus) for n, node in topo.nodes.items()}
    request = PlacementRequest("hi", "hi-r1", gang(2, rack=True), 0)
    chosen = select_victims(cluster, request, allocs, NOW, topology=topo, restart_cost_s=300.0)
    assert chosen is not None and len(chosen.victims) == 2
    assert chosen.cost_gpu_seconds == pytest.approx(chosen.lost_gpu_seconds + 2 * 8 * 300.0)
    assert {n: list(node.free_gpus) for n, node in topo.nodes.items()} == before
    assert select_victims(cluster, request, allocs, NOW, restart_cost_s=300.0) == chosen


@st.composite
def worlds(draw):
    """Up to 3 racks of up to 3 nodes, every GPU held by a run of one or two nodes, and a waiting gang."""
    racks = {f"n{i}": f"r{i % draw(st.integers(1, 3))}" for i in range(draw(st.integers(1, 8)))}
    names = sorted(racks)
    runs, k = [], 0
    i = 0
    while i < len(names):
        width = draw(st.sampled_from([1, 2] if i + 1 < len(names) else [1]))
        gpus = draw(st.sampled_from([4, 8]))
        where = {names[i + w]: range(8 - gpus, 8) for w in range(width)}
        runs.append(
            run(
                f"j{k}",
                where,
                age=draw(st.sampled_from([10.0, 600.0, 3000.0])),
                priority=draw(st.sampled_from([0, 20])),
                preemptible=draw(st.booleans()),
            )
        )
        k += 1
        i += width
    spec = gang(draw(st.integers(1, 3)), rack=draw(st.booleans()))
    return racks, runs, spec


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(world=worlds())
def test_a_gang_preempts_only_what_it_can_then_be_placed_on(world):
    racks, runs, spec = world
    result = decide(racks, runs, spec)
    if not result.preemptions:
        return
    stopped = {p.job_id for p in result.preemptions}
    by_id = {r[0]: r for r in runs}
    assert all(by_id[j][4] and by_id[j][3] < 10 for j in stopped)  # preemptible, lower priority
    held = {n: set() for n in racks}
    for job_id, where, *_ in runs:
        if job_id not in stopped:
            for n, g in where.items():
                held[n].update(g)
    nodes = [
        NodeView(NodeInfo(n, "c1", "H100", 8, rack=r), tuple(g for g in range(8) if g not in held[n]))
        for n, r in racks.items()
    ]
    assert fit_gang(build_topology(ClusterSnapshot(nodes)), spec) is not None


def test_the_victim_search_is_skipped_when_every_candidate_together_frees_too_few_gpus():
    def candidate(gpus: int, gpu_type: int = 0) -> Candidate:
        holder = Holder(RunningJob("r", "a", "q", {"H100": gpus}, started_at=NOW - 60), 0, [(gpu_type, gpus)])
        return Candidate(holder, NOW, 300.0, None, {gpu_type})

    waiting = Blocked(PendingJob("hi", "a", "q", 0, {"H100": 16}), 0, [(0, 16)], 0, 0)
    assert _enough([16], waiting, [])  # it fits the free GPUs already
    assert not _enough([4], waiting, [candidate(8)])  # 4 free + 8 freed < 16
    assert _enough([4], waiting, [candidate(8), candidate(4)])  # exactly enough
    assert not _enough([4], waiting, [candidate(8), candidate(8, gpu_type=1)])  # another type's GPUs do not count
    two_types = Blocked(PendingJob("hi", "a", "q", 0, {"H100": 8, "A100": 8}), 0, [(0, 8), (1, 8)], 0, 0)
    assert not _enough([8, 0], two_types, [candidate(4, gpu_type=1)])
    assert _enough([8, 0], two_types, [candidate(4, gpu_type=1), candidate(4, gpu_type=1)])
