"""Tiny scenarios whose outcome is worked out by hand."""

import msgspec
import pytest

from trainyard.core.invariants import check_job_log
from trainyard.sim import FailureModel, Scenario, SimCluster, SimJob, Simulator, Workload, build_nodes, policy_named
from trainyard.sim.engine import FAIL
from trainyard.sim.workloads import gang_of


def run(jobs, nodes, policy, scenario=Scenario(tick_s=0, check_every=1), quota=None):
    w = Workload(jobs, {"a": quota or nodes * 8}, "golden")
    sim = Simulator(w, SimCluster(build_nodes(nodes)), policy_named(policy), scenario).run()
    assert sim.violations == []
    assert check_job_log(sim.events).violations == []
    return sim


def jcts(sim):
    return [st.end - st.job.submit for st in sim.jobs]


@pytest.mark.parametrize(
    "policy, expected",
    [
        pytest.param("fifo", [100, 140, 170, 180], id="fifo runs four whole-cluster gangs in submission order"),
        pytest.param("sjf", [180, 80, 40, 10], id="sjf runs the same four gangs shortest first"),
        pytest.param("slurm", [100, 140, 170, 180], id="slurm with equal age and size keeps submission order"),
        pytest.param("trainyard", [100, 140, 170, 180], id="trainyard in one queue keeps submission order"),
    ],
)
def test_four_gangs_on_two_nodes(policy, expected):
    jobs = [SimJob(i, "a", 0.0, d, gang_of(16)) for i, d in enumerate([100, 40, 30, 10])]
    sim = run(jobs, 2, policy)
    assert jcts(sim) == expected
    assert sum(expected) / 4 == pytest.approx(147.5 if policy != "sjf" else 77.5)


@pytest.mark.parametrize(
    "policy, expected",
    [
        pytest.param("fifo", [100, 149, 158], id="fifo: the 4-GPU job waits behind the 8-GPU one"),
        pytest.param("sjf", [100, 159, 108], id="sjf: the 10 s job goes before the 50 s one"),
    ],
)
def test_one_node_three_jobs(policy, expected):
    jobs = [
        SimJob(0, "a", 0.0, 100, gang_of(8)),
        SimJob(1, "a", 1.0, 50, gang_of(8)),
        SimJob(2, "a", 2.0, 10, gang_of(4)),
    ]
    assert jcts(run(jobs, 1, policy)) == expected


def test_failed_node_loses_work_since_checkpoint_and_restarts_after_repair():
    model = FailureModel(
        rate_per_1000_node_days=0.0,
        causes={"gpu": 1},
        repair_s={"gpu": 1000.0},
        detection_s=60.0,
        restart_overhead_s=300.0,
        checkpoint_interval_s=3600.0,
    )
    w = Workload([SimJob(0, "a", 0.0, 10_000, gang_of(8))], {"a": 8}, "golden")
    sim = Simulator(
        w, SimCluster(build_nodes(1)), policy_named("fifo"), Scenario(tick_s=0, failures=model, check_every=1)
    )
    sim.push(5000.0, FAIL, "n00000")
    sim.run()
    st = sim.jobs[0]
    # 5,000 s ran, 3,600 s checkpointed: 1,400 s lost plus 60 s until the failure was noticed
    assert st.gpus_lost == pytest.approx((1400 + 60) * 8)
    # back at 6,000 s, 300 s to restart, 6,400 s of work left
    assert st.end == pytest.approx(6000 + 300 + 6400)
    assert st.failures == 1 and st.attempt == 2
    kinds = [type(e).__name__ for e in sim.events]
    assert kinds == [
        "JobAccepted",
        "JobAdmitted",
        "JobPlaced",
        "RunStarted",
        "CheckpointSaved",
        "RunFailed",
        "JobAdmitted",
        "JobPlaced",
        "RunStarted",
        "CheckpointSaved",
        "RunSucceeded",
    ]
    # a checkpoint every 3,600 s of work: at 3,600 s, then 3,600 s after the restart overhead of the second run
    checkpoints = [e for e in sim.events if type(e).__name__ == "CheckpointSaved"]
    assert [(e.at, e.run_id, e.step) for e in checkpoints] == [
        (3600.0, "j0000000.1", 3600),
        (6000.0 + 300 + 3600, "j0000000.2", 7200),
    ]
    assert sim.events[5].reason == "node_failure" and sim.events[5].node_id == "n00000"
    assert check_job_log(sim.events).violations == []
    assert sim.violations == []


def test_gang_larger_than_quota_is_rejected_not_stuck():
    jobs = [SimJob(0, "a", 0.0, 10, gang_of(32)), SimJob(1, "a", 0.0, 10, gang_of(8))]
    sim = run(jobs, 2, "fifo", quota=16)
    assert [st.status for st in sim.jobs] == ["rejected", "done"]
    assert type(sim.events[0]).__name__ == "JobRejected"  # rejected instead of accepted, as admission does live
    assert check_job_log(sim.events).status["j0000000"] == "rejected"


@pytest.mark.parametrize(
    "calc_s, expected",
    [
        pytest.param(
            300.0, [10_000, 10_010, 1_020], id="recomputed every 5 minutes: the older job's age puts it first"
        ),
        pytest.param(1e9, [10_000, 10_020, 1_010], id="never recomputed: each job keeps its score from submission"),
    ],
)
def test_slurm_priorities_are_recomputed_once_per_period(calc_s, expected):
    # Age (full after 10,000 s) and size only.  Job 1 (8 GPUs) waits from 0 s behind job 0 (both nodes until
    # 10,000 s); job 2 (16 GPUs) comes at 9,000 s.  Fresh at 10,000 s: job 1 = 1,000 + 500, job 2 = 100 + 1,000.
    # As scored on submission: job 1 = 0 + 500, job 2 = 0 + 1,000.
    policy = msgspec.structs.replace(
        policy_named("slurm"), age_cap_s=10_000.0, fairshare_weight=0.0, size_weight=1000.0, priority_calc_s=calc_s
    )
    jobs = [
        SimJob(0, "a", 0.0, 10_000, gang_of(16)),
        SimJob(1, "a", 0.0, 10, gang_of(8)),
        SimJob(2, "a", 9_000.0, 10, gang_of(16)),
    ]
    w = Workload(jobs, {"a": 16}, "golden")
    sim = Simulator(w, SimCluster(build_nodes(2)), policy, Scenario(tick_s=0, check_every=1)).run()
    assert sim.violations == []
    assert jcts(sim) == expected
