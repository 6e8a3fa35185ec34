"""Jobs run for real on the whole stack: three node agents, each a node of 3 fake
GPUs, start, watch, stop and report the processes of the jobs placed on them,
and the output of every rank can be read back (docs/execution.md)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from execution_fixtures import ALLREDUCE, Api, agent_stack, cli, commands, job_events, job_processes, rank_records

from trainyard.events import RunFailed, RunStarted
from trainyard.ledger import Ledger
from trainyard.local import LocalStack

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    with agent_stack(tmp_path_factory.mktemp("execution"), agents=3, agent_gpus=3, heartbeat_timeout_s=15.0) as s:
        yield s


@pytest.fixture
def api(stack: LocalStack) -> Api:
    return Api(stack)


def allreduce(job_id: str, *args: str, replicas: int = 3, **spec: object) -> dict[str, object]:
    return {
        "job_id": job_id,
        "tenant": "acme",
        "queue": "default",
        "name": job_id,
        "roles": [
            {"name": "worker", "replicas": replicas, "gpus_per_replica": 1, "command": ["python3", ALLREDUCE, *args]}
        ],
        "stop_grace_s": 10,
        **spec,
    }


def test_the_readme_first_job_runs_and_trainyard_logs_prints_each_ranks_output(stack: LocalStack, api: Api) -> None:
    """The README's first job: `trainyard submit --tenant acme --gpus 2 -- python3 -c ...` succeeds and
    `trainyard logs JOB --rank R` prints what each of its two processes printed."""
    code = "import os; print('hello from rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'])"
    submitted = cli(stack, "submit", "--tenant", "acme", "--gpus", "2", "--", "python3", "-c", code)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().splitlines()[0]
    assert api.wait_status(job_id, {"succeeded", "failed"}) == "succeeded", api.job(job_id)

    for rank in (0, 1):
        shown = cli(stack, "logs", job_id, "--rank", str(rank))
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout == f"hello from rank {rank} of 2\n"


def test_a_three_replica_all_reduce_runs_one_rank_per_agent_sums_right_and_is_metered_to_its_wall_time(
    stack: LocalStack, api: Api
) -> None:
    """examples/distributed/allreduce.py as 3 replicas x 1 GPU: with every agent already holding 2 of
    its 3 GPUs for another job, the gang gets exactly one process per agent, ranks 0..2 once each,
    one MASTER_ADDR:MASTER_PORT, GPUs disjoint from the other job's on the same agent; every step's
    sum is right, the run starts once, and the ledger's GPU-seconds are 3 x its wall time within 2 %."""
    blocker = hold_two_gpus_per_agent(stack, api, "blocker")

    job_id = api.submit(allreduce("allreduce", "--steps", "30", "--step-seconds", "0.5", "--checkpoint-every", "5"))
    procs = api.wait(lambda: len(p := commands(stack, job_id)) == 3 and p, 60, "the all-reduce's three processes")
    run_id = procs[0].run_id
    records = {r.pid: r for r in rank_records(stack, run_id)}
    assert sorted(records[p.pid].node for p in procs) == ["a00", "a01", "a02"], "one process per agent"
    assert sorted(p.rank for p in procs) == [0, 1, 2]
    assert {(p.env["MASTER_ADDR"], p.env["MASTER_PORT"], p.env["WORLD_SIZE"]) for p in procs} == {
        (procs[0].env["MASTER_ADDR"], procs[0].env["MASTER_PORT"], "3")
    }
    blocker_run = api.job(blocker)["run_id"]
    held = {r.pid: r.node for r in rank_records(stack, blocker_run)}
    for node in ("a00", "a01", "a02"):
        mine = {p.env["CUDA_VISIBLE_DEVICES"] for p in procs if records[p.pid].node == node}
        theirs = {p.env["CUDA_VISIBLE_DEVICES"] for p in commands(stack, blocker) if held.get(p.pid) == node}
        assert len(mine) == 1 and len(theirs) == 2 and not mine & theirs, (node, mine, theirs)

    assert api.wait_status(job_id, {"succeeded", "failed"}, timeout=90) == "succeeded", api.job(job_id)
    for rank in range(3):
        out = api.get(f"/v1/jobs/{job_id}/logs", rank=rank)["data"]
        assert f"rank {rank} of 3" in out
        assert "step 29: all-reduce sum=180 ok" in out and f"rank {rank}: done, 30 steps" in out
    events = job_events(stack, job_id)
    assert [e.run_id for e in events if isinstance(e, RunStarted)] == [run_id]

    ended = rank_records(stack, run_id)
    assert [r.exit for r in ended] == ["exit 0"] * 3
    wall = max(r.exited_at or 0.0 for r in ended) - min(r.started_at for r in ended)
    ledger = Ledger(stack.ledger_url)
    try:
        row = api.wait(
            lambda: next((r for r in ledger.runs(job_id=job_id) if r.ended_at is not None), None),
            30,
            "the run in the ledger",
        )
    finally:
        ledger.close()
    assert row.run_id == run_id
    assert abs(row.gpu_seconds - 3 * wall) <= 0.02 * 3 * wall, (row, wall)
    release(stack, api, blocker)


def hold_two_gpus_per_agent(stack: LocalStack, api: Api, job_id: str) -> str:
    """A job of 3 replicas x 2 GPUs, one replica per agent (3 GPUs each), so that a gang of
    3 x 1 GPU submitted next gets one GPU on every agent."""
    api.submit(
        {
            "job_id": job_id,
            "tenant": "acme",
            "queue": "default",
            "roles": [{"name": "hold", "replicas": 3, "gpus_per_replica": 2, "command": ["sleep", "600"]}],
            "stop_grace_s": 2,
        }
    )
    api.wait(lambda: len(commands(stack, job_id)) == 6, 60, f"the six processes of {job_id}")
    assert {r.node for r in rank_records(stack, api.job(job_id)["run_id"])} == {"a00", "a01", "a02"}
    return job_id


def release(stack: LocalStack, api: Api, job_id: str) -> None:
    api.cancel(job_id)
    assert api.wait_status(job_id, {"cancelled"}) == "cancelled"
    api.wait(lambda: not job_processes(stack, job_id), 30, f"the processes of {job_id} to be gone")


def test_a_rank_exiting_3_stops_its_peers_within_5_s_and_the_failure_names_rank_node_code_and_output(
    stack: LocalStack, api: Api
) -> None:
    """Rank 1 of the all-reduce, one rank per agent, exits 3 at step 2: ranks 0 and 2 are gone within
    5 s of its exit, and the job fails with a message naming rank 1, its node, exit code 3 and the end
    of its output (not a peer that failed, a little later, because its connection to rank 1 dropped)."""
    blocker = hold_two_gpus_per_agent(stack, api, "holder")
    job_id = api.submit(allreduce("fails", "--fail-rank", "1", "--fail-at-step", "2", max_retries=0))
    assert api.wait_status(job_id, {"failed", "succeeded"}, timeout=90) == "failed"
    job = api.job(job_id)
    records = {r.rank: r for r in rank_records(stack, job["run_id"])}
    assert sorted(r.node for r in records.values()) == ["a00", "a01", "a02"], "one rank per agent"
    assert records[1].exit == "exit 3"
    api.wait(lambda: not job_processes(stack, job_id), 10, "every process of the job to be gone")
    failed_at = records[1].exited_at
    assert failed_at is not None
    for rank in (0, 2):
        gone = records[rank].exited_at
        assert gone is not None and gone - failed_at < 5.0, (rank, gone - failed_at if gone else None)

    [failure] = [e for e in job_events(stack, job_id) if isinstance(e, RunFailed)]
    assert failure.reason == "workload_error"
    assert failure.message.startswith(f"rank 1 on {records[1].node} exited with code 3"), failure.message
    assert "rank 1: failing at step 2 as asked" in failure.message
    assert failure.node_id == records[1].node
    assert job["message"] == failure.message
    release(stack, api, blocker)


def test_cancel_and_the_time_limit_leave_no_process_of_the_job_behind_after_the_grace_period(
    stack: LocalStack, api: Api
) -> None:
    """A 60 s job that ignores SIGTERM (its shell and the shell's child both) is cancelled while it
    runs, and another is given max_runtime_s 10: /proc holds no process of either job
    stop_grace_s + 2 s after the cancel, and after the time limit."""
    grace = 3
    ignore = ["sh", "-c", "trap '' TERM; sleep 60 & sleep 60; wait"]
    body = {"tenant": "acme", "queue": "default", "roles": [{"name": "w", "command": ignore}], "stop_grace_s": grace}
    cancelled = api.submit({**body, "job_id": "cancelled"})
    limited = api.submit({**body, "job_id": "limited", "max_runtime_s": 10, "max_retries": 0})
    for job_id in (cancelled, limited):
        api.wait(lambda j=job_id: len(commands(stack, j)) == 3, 60, f"the shell and its two sleeps of {job_id}")  # type: ignore[misc]

    asked = time.time()
    api.cancel(cancelled)
    api.wait(lambda: not job_processes(stack, cancelled), grace + 10, "the cancelled job's processes to be gone")
    assert time.time() - asked <= grace + 2
    assert api.wait_status(cancelled, {"cancelled"}) == "cancelled"

    [started] = rank_records(stack, api.job(limited)["run_id"])
    api.wait(lambda: not job_processes(stack, limited), 10 + grace + 30, "the time-limited job's processes to be gone")
    assert time.time() - (started.started_at + 10) <= grace + 2
    assert api.wait_status(limited, {"failed"}) == "failed"
    assert api.job(limited)["reason"] == "timeout"
