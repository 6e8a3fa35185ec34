"""Determinism, invariants and the simulator's decisions equal direct calls of the core."""

import msgspec
import pytest

from trainyard.core.admission import admit
from trainyard.core.admission.tree import Scheduling
from trainyard.core.invariants import check_job_log
from trainyard.core.placement import place
from trainyard.core.placement.cycle import build_topology
from trainyard.sim import FailureModel, Scenario, SimCluster, build_nodes, policy_named, simulate, synthetic
from trainyard.sim.policies import BACKFILL, Policy
from trainyard.sim.report import summarise

FAILING = FailureModel(rate_per_1000_node_days=2000.0, lemon_fraction=0.1, checkpoint_interval_s=1800.0)


#: the default with fair-share preemption after only 30 minutes: preempts often
FAIR_SHARE_30M = Policy(
    "fair-share-30m", preemption=True, min_runtime_s=1800.0, scheduling=Scheduling(), placement=BACKFILL
)


def small(policy, seed=3, jobs=160, nodes=16, failures=FAILING, **kw):
    w = synthetic(jobs, nodes * 8, seed=seed, load=0.6, tenants=3)
    scenario = Scenario(tick_s=kw.pop("tick_s", 120.0), seed=seed, failures=failures, **kw)
    chosen = policy if isinstance(policy, Policy) else policy_named(policy)
    return simulate(w, SimCluster(build_nodes(nodes, nodes_per_rack=4, racks_per_block=2)), chosen, scenario)


@pytest.mark.parametrize("policy", ["trainyard", "fifo", "sjf", "sjf-backfill", "slurm", "tiresias"])
def test_same_seed_same_result(policy):
    a, b = summarise(small(policy, jobs=100)), summarise(small(policy, jobs=100))
    assert a == b
    assert a["done"] + a["rejected"] == a["jobs"]


def test_another_seed_another_result():
    assert summarise(small("fifo", seed=3, jobs=100)) != summarise(small("fifo", seed=4, jobs=100))


@pytest.mark.parametrize("policy", ["trainyard", FAIR_SHARE_30M, "fifo", "sjf", "sjf-backfill", "slurm", "tiresias"])
def test_invariants_hold_at_every_cycle_with_failures(policy):
    sim = small(policy, check_every=1)
    assert sim.violations == []
    assert sim.failure_log, "the scenario should see node failures"
    fold = check_job_log(sim.events)
    assert fold.violations == []
    assert all(fold.status[st.job.job_id] in ("succeeded", "rejected") for st in sim.jobs)
    assert all(st.status in ("done", "rejected") for st in sim.jobs)


def test_preemption_shows_up_in_the_log_and_the_ledger_of_lost_work():
    sim = small(FAIR_SHARE_30M, jobs=200, failures=FailureModel(enabled=False), check_every=1)
    preempted = [e for e in sim.events if type(e).__name__ == "RunFailed" and e.reason == "preempted"]
    assert preempted, "fair-share preemption after 30 minutes should preempt in this scenario"
    assert len(preempted) == sum(st.preemptions for st in sim.jobs)
    assert check_job_log(sim.events).violations == []


@pytest.mark.parametrize(
    ("policy", "failures"),
    [
        ("trainyard", FAILING),
        ("slurm", FAILING),
        # no node down: the preemption pass searches the simulator's live tree, the replay a tree built afresh
        ("trainyard", FailureModel(enabled=False)),
    ],
)
def test_simulator_decisions_equal_direct_core_calls(policy, failures):
    sim = small(policy, jobs=120, nodes=8, failures=failures, trace_decisions=True)
    assert sim.decisions
    if not failures.enabled:
        assert any(d[0] == "admit" and d[1].cluster is not None and d[3].preemptions for d in sim.decisions)
    admits = places = 0
    for d in sim.decisions:
        if d[0] == "admit":
            _, snapshot, now, result = d
            assert admit(snapshot, sim.admission, now) == result
            admits += 1
        else:
            _, snapshot, requests, now, result = d
            direct = place(snapshot, requests, now)
            assert msgspec.to_builtins(direct) == msgspec.to_builtins(result)
            places += 1
    assert admits > 10 and places > 10


def test_admission_given_the_clusters_tree_decides_the_same_and_leaves_the_tree_as_it_was():
    sim = small("trainyard", jobs=120, nodes=8, failures=FailureModel(enabled=False), trace_decisions=True)
    with_cluster = [d for d in sim.decisions if d[0] == "admit" and d[1].cluster is not None]
    assert any(d[3].preemptions for d in with_cluster)
    for _, snapshot, now, result in with_cluster:
        topo = build_topology(snapshot.cluster)
        before = _free_state(topo)
        assert admit(snapshot, sim.admission, now, topology=topo) == result
        assert _free_state(topo) == before
        assert topo.journal is None  # no longer recording


def _free_state(topo):
    return [
        (d.key, d.free, d.whole, tuple(d.hist), tuple(getattr(d, "free_gpus", ())))
        for tree in topo.trees.values()
        for index in tree.levels.values()
        for d in index.values()
    ]
