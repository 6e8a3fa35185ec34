"""What the simulator models that the live system decides on: GPU types, priority classes, backfill,
run-time limits and the lifecycle fold's requeue rules, each in a small scenario."""

import pytest

from trainyard.core.invariants import check_job_log
from trainyard.sim import Scenario, SimCluster, SimJob, Simulator, Workload, build_nodes, policy_named
from trainyard.sim.workloads import gang_of

GOLDEN = Scenario(tick_s=0, check_every=1)


def run(jobs, nodes, policy="trainyard", quotas=None, scenario=GOLDEN):
    w = Workload(jobs, quotas or {"a": sum(n.gpus for n in nodes)}, "policy")
    sim = Simulator(w, SimCluster(nodes), policy_named(policy), scenario).run()
    assert sim.violations == []
    assert check_job_log(sim.events).violations == []
    return sim


def nodes_of(node_type: str, count: int, prefix: str):
    return build_nodes(count, gpu_type=node_type, prefix=prefix)


def test_jobs_run_only_on_nodes_of_the_gpu_type_they_ask_for():
    nodes = nodes_of("H100", 1, "h") + nodes_of("A100", 1, "a")
    jobs = [
        SimJob(0, "a", 0.0, 100, gang_of(8), gpu_type="A100"),
        SimJob(1, "a", 0.0, 100, gang_of(8), gpu_type="H100"),
        SimJob(2, "a", 0.0, 100, gang_of(8), gpu_type="A100"),
    ]
    sim = run(jobs, nodes)
    placed = {e.job_id: {r.node_id[0] for r in e.replicas} for e in sim.events if type(e).__name__ == "JobPlaced"}
    assert placed == {"j0000000": {"a"}, "j0000001": {"h"}, "j0000002": {"a"}}
    # the second A100 job waited for the first although H100 GPUs were free
    assert [st.end for st in sim.jobs] == [100.0, 100.0, 200.0]


def test_a_type_the_cluster_does_not_have_is_rejected():
    sim = run([SimJob(0, "a", 0.0, 100, gang_of(8), gpu_type="B200")], nodes_of("H100", 1, "h"))
    assert sim.jobs[0].status == "rejected"


def test_a_production_job_preempts_a_standard_one_and_the_victim_resumes_from_its_notice():
    jobs = [
        SimJob(0, "a", 0.0, 1000, gang_of(8), priority_class="standard"),
        SimJob(1, "a", 100.0, 50, gang_of(8), priority_class="production"),
    ]
    sim = run(jobs, nodes_of("H100", 1, "h"))
    victim, urgent = sim.jobs
    assert victim.preemptions == 1 and urgent.preemptions == 0
    assert urgent.end == 150.0  # started at once
    # it checkpointed during its notice: only the restart is lost, and it finishes 1,000 s of work in total
    assert victim.end == pytest.approx(150.0 + 900.0 + sim.scenario.failures.restart_overhead_s)


def test_the_victim_is_the_run_that_loses_least_since_its_last_checkpoint():
    # Two standard 4-GPU runs share the node; at 4,000 s the first has checkpointed (at 3,600 s: 400 s of
    # work at stake), the second, started at 1,000 s, has not (3,000 s at stake).  Priced by the work since
    # the start, as without checkpoints on the log, the second would be the cheaper one.
    jobs = [
        SimJob(0, "a", 0.0, 20_000, gang_of(4), priority_class="standard"),
        SimJob(1, "a", 1000.0, 20_000, gang_of(4), priority_class="standard"),
        SimJob(2, "a", 4000.0, 50, gang_of(4), priority_class="production"),
    ]
    sim = run(jobs, nodes_of("H100", 1, "h"))
    checkpointed, fresh, urgent = sim.jobs
    assert (checkpointed.preemptions, fresh.preemptions, urgent.preemptions) == (1, 0, 0)
    assert urgent.end == 4050.0
    saved = [(e.job_id, e.at) for e in sim.events if type(e).__name__ == "CheckpointSaved" and e.at <= 4000]
    assert saved == [("j0000000", 3600.0)]


def test_a_production_job_is_never_preempted():
    jobs = [
        SimJob(0, "a", 0.0, 1000, gang_of(8), priority_class="production"),
        SimJob(1, "a", 100.0, 50, gang_of(8), priority_class="production"),
    ]
    sim = run(jobs, nodes_of("H100", 1, "h"))
    assert [st.preemptions for st in sim.jobs] == [0, 0]
    assert [st.end for st in sim.jobs] == [1000.0, 1050.0]


def test_a_run_is_stopped_at_its_limit_and_retried_from_its_checkpoint():
    scenario = Scenario(tick_s=0, check_every=1)
    job = SimJob(0, "a", 0.0, 5000, gang_of(8), limit_s=3600)
    sim = run([job], nodes_of("H100", 1, "h"), scenario=scenario)
    st = sim.jobs[0]
    timeouts = [e for e in sim.events if type(e).__name__ == "RunFailed" and e.reason == "timeout"]
    assert len(timeouts) == 1 and st.status == "done"
    assert check_job_log(sim.events).status[job.job_id] == "succeeded"


def test_a_run_that_never_fits_its_limit_fails_after_its_retries():
    from trainyard.sim.failures import FailureModel

    no_checkpoints = Scenario(tick_s=0, check_every=1, failures=FailureModel(enabled=False, checkpoint_interval_s=1e9))
    job = SimJob(0, "a", 0.0, 10_000, gang_of(8), limit_s=3600)
    sim = run([job], nodes_of("H100", 1, "h"), scenario=no_checkpoints)
    assert sim.jobs[0].status == "failed"
    assert check_job_log(sim.events).status[job.job_id] == "failed"
    assert sum(1 for e in sim.events if type(e).__name__ == "JobAdmitted") == 4  # the run and its 3 retries


@pytest.mark.parametrize(
    "policy, small_end",
    [
        pytest.param("fifo", 310.0, id="fifo: the short job waits behind the gang"),
        pytest.param("trainyard", 12.0, id="trainyard: the short job starts around the gang and ends long before it"),
    ],
)
def test_backfill_starts_a_short_job_around_a_waiting_gang(policy, small_end):
    # one node busy until t=100 (its limit says 1 hour); a 2-node gang waits; a 10 s job fits on the free node
    jobs = [
        SimJob(0, "a", 0.0, 100, gang_of(8), limit_s=3600),
        SimJob(1, "a", 1.0, 200, gang_of(16), limit_s=3600),
        SimJob(2, "a", 2.0, 10, gang_of(8), limit_s=60),
    ]
    sim = run(jobs, nodes_of("H100", 2, "h"), policy=policy)
    assert sim.jobs[2].end == small_end
    assert sim.jobs[1].end == 300.0  # the gang is not delayed either way


def test_a_trace_on_a_cluster_of_two_gpu_models_runs_each_job_on_its_model(tmp_path):
    from trainyard.sim.scenarios import prepare

    trace = tmp_path / "trace.csv"
    trace.write_text("submit_time,duration,gpus,gpu_type,tenant\n0,100,8,A100,a\n0,100,8,,a\n10,100,4,H200,b\n")
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("node_id,gpus,gpu_model,rack,block\na1,8,A100,r1,b1\nh1,8,H200,r2,b1\nh2,8,H200,r2,b1\n")
    plan = prepare(trace=str(trace), nodes_file=str(nodes))
    # the untyped job runs on the model with the most GPUs
    assert [j.gpu_type for j in plan.workload.jobs] == ["A100", "H200", "H200"]
    sim = Simulator(plan.workload, SimCluster(plan.nodes), policy_named("trainyard"), GOLDEN).run()
    assert sim.violations == [] and all(st.status == "done" for st in sim.jobs)
    model = {n.node_id: n.gpu_type for n in plan.nodes}
    for e in sim.events:
        if type(e).__name__ == "JobPlaced":
            job = sim.jobs[int(e.job_id[1:])].job
            assert {model[r.node_id] for r in e.replicas} == {job.gpu_type}


def test_a_best_effort_job_reaches_admission_as_borrow_only_and_lowest_priority():
    nodes = nodes_of("H100", 2, "h")
    jobs = [
        SimJob(0, "b", 0.0, 100, gang_of(8), priority_class="best-effort"),
        SimJob(1, "a", 0.0, 100, gang_of(8), priority_class="standard"),
    ]
    scenario = Scenario(tick_s=0, check_every=1, trace_decisions=True)
    sim = run(jobs, nodes, quotas={"a": 16, "b": 0}, scenario=scenario)
    _, snapshot, _, _ = next(d for d in sim.decisions if d[0] == "admit")
    seen = {p.job_id: (p.may_only_borrow, p.priority) for p in snapshot.pending}
    assert seen == {"j0000000": (True, 0), "j0000001": (False, 500)}
    assert all(st.status == "done" for st in sim.jobs)
