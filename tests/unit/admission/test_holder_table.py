"""``HolderTable`` keeps ``load_holders``' sums as runs come and go: after any
sequence of puts (new runs, runs told to stop, runs put again, new checkpoints) and drops, its
holdings equal a fresh ``load_holders`` pass over the same runs in the same
order (and so do the holders' expected ends that backfill plans with, and the groups a preemption pass
weighs), and ``admit`` decides the same with it as without it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from trainyard.core.admission import (
    AdmissionPolicy,
    AdmissionSnapshot,
    Cohort,
    FlavorQuota,
    HolderTable,
    PendingJob,
    PreemptionSettings,
    QueueQuota,
    RunningJob,
    Tenancy,
    admit,
)
from trainyard.core.admission.backfill import Shadows
from trainyard.core.admission.candidates import HolderGroups, group_holders, load_holders
from trainyard.core.admission.ordering import DemandCache
from trainyard.core.admission.tree import Scheduling, TreeIndex

FLAVORS = ["H100", "A100"]
QUEUES = [("t1", "q1"), ("t1", "q2"), ("t2", "q1"), ("t3", "nowhere")]  # the last one the tree does not know
TENANCY = Tenancy(
    queues=[QueueQuota(t, q, "org", {"H100": FlavorQuota(8, 8), "A100": FlavorQuota(4, 4)}) for t, q in QUEUES[:3]],
    cohorts=[Cohort("org", None, {"H100": FlavorQuota(24, 0), "A100": FlavorQuota(12, 0)})],
    preemption=PreemptionSettings(min_runtime_s=0.0, attained_service=True, attained_service_min_runtime_s=0.0),
    scheduling=Scheduling(order="las", backfill=True),
)

gpus = st.one_of(st.dictionaries(st.sampled_from([*FLAVORS, "V100"]), st.integers(1, 6), min_size=1, max_size=2))
runs = st.builds(
    lambda job, where, g, started, prio, preemptible, borrow, notice, limit, saved: RunningJob(
        job_id=f"j{job}",
        tenant=where[0],
        queue=where[1],
        gpus_by_type=g,
        started_at=started,
        priority=prio,
        preemptible=preemptible,
        may_only_borrow=borrow,
        notice_at=notice,
        expected_end=None if limit is None else started + limit,
        last_checkpoint_at=saved,
    ),
    st.integers(0, 30),
    st.sampled_from(QUEUES),
    gpus,
    st.floats(0, 1000),
    st.integers(0, 2),
    st.booleans(),
    st.booleans(),
    st.one_of(st.none(), st.just(500.0)),
    st.one_of(st.none(), st.sampled_from([600.0, 3600.0])),  # no limit, or limits that make equal ends
    st.one_of(st.none(), st.floats(0, 1000)),
)
ops = st.lists(st.tuples(st.sampled_from(["put", "drop", "checkpoint"]), st.integers(0, 12), runs), max_size=60)


def fresh(running: list[RunningJob]) -> tuple:
    index = TreeIndex(TENANCY, FLAVORS)
    holders, held, usage, lowest, noticed = load_holders(running, index, DemandCache(index.fidx))
    return [tuple(h) for h in holders], held, usage, lowest, noticed


@settings(max_examples=300, deadline=None)
@given(ops)
def test_the_table_holds_what_a_fresh_pass_would_read(steps: list) -> None:
    table = HolderTable(TENANCY, FLAVORS)
    mirror: dict[int, RunningJob] = {}  # what a caller keeps: a dict, in the order runs were first put
    for op, key, run in steps:
        if op == "put":
            table.put(key, run)
            mirror[key] = run
        elif op == "checkpoint":  # the run under ``key`` saved a checkpoint: only its price changes
            if key in mirror:
                saved = replace(mirror[key], last_checkpoint_at=run.started_at)
                table.put(key, saved)
                mirror[key] = saved
        else:
            table.drop(key)
            mirror.pop(key, None)
        holders, held, usage, lowest, noticed = table.holdings()
        assert len(table) == len(mirror)
        assert ([tuple(h) for h in holders], held, usage, lowest, noticed) == fresh(list(mirror.values()))
        assert table.releases() == Shadows(len(FLAVORS), holders, 0.0).releases
        assert unordered(table.groups()) == unordered(group_holders(holders))


def unordered(groups: HolderGroups) -> tuple:
    """The groups with each list in one fixed order: the order inside a queue is not part of what they say."""

    def by_id(hs: list) -> list:
        return sorted((tuple(h) for h in hs), key=repr)

    return by_id(groups.noticed), {q: by_id(hs) for q, hs in groups.grouped.items()}, groups.lowest, groups.lenders


@settings(max_examples=100, deadline=None)
@given(
    st.lists(runs, max_size=12, unique_by=lambda r: r.job_id),
    st.lists(st.tuples(st.sampled_from(QUEUES), gpus, st.integers(0, 2), st.floats(0, 5000)), max_size=10),
)
def test_admit_decides_the_same_with_the_table(running: list[RunningJob], waiting: list) -> None:
    pending = [
        PendingJob(f"p{i}", t, q, i, g, priority=prio, attained_gpu_s=served, submitted_at=0.0)
        for i, ((t, q), g, prio, served) in enumerate(waiting)
    ]
    in_use: dict[str, int] = {}
    for r in running:
        for f, n in r.gpus_by_type.items():
            in_use[f] = in_use.get(f, 0) + n
    snapshot = AdmissionSnapshot(pending, {"H100": 32, "A100": 16}, in_use, running)
    policy = AdmissionPolicy(tenancy=TENANCY)
    table = HolderTable(TENANCY, FLAVORS)
    for r in running:
        table.put(r.job_id, r)
    assert admit(snapshot, policy, 2000.0, table) == admit(snapshot, policy, 2000.0)
    other = HolderTable(Tenancy(queues=TENANCY.queues, cohorts=TENANCY.cohorts), FLAVORS)  # another tenancy
    for r in running:
        other.put(r.job_id, r)
    assert admit(snapshot, policy, 2000.0, other) == admit(snapshot, policy, 2000.0)  # not used: read afresh


def test_a_table_that_does_not_hold_the_snapshots_runs_is_refused() -> None:
    run = RunningJob("j1", "t1", "q1", {"H100": 2}, started_at=0.0)
    snapshot = AdmissionSnapshot([], {"H100": 32, "A100": 16}, {"H100": 2}, [run])
    try:
        admit(snapshot, AdmissionPolicy(tenancy=TENANCY), 10.0, HolderTable(TENANCY, FLAVORS))
    except ValueError as err:
        assert "1" in str(err) and "0" in str(err)
    else:
        raise AssertionError("a table of no runs was taken for a snapshot of one")
