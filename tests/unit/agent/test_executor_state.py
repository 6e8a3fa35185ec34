"""What outlives a process or the agent: reattach after a restart, idempotent
starts, GPUs never held twice, checkpoints, logs and their rotation."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from agent_fixtures import Reports, launch, order

from trainyard.agent import runlogs
from trainyard.agent.executor import Executor
from trainyard.agent.processes import alive
from trainyard.events.work import CheckpointWritten, ProcessesStarted, ProcessExited, StopRun
from trainyard.testing.waiting import eventually

WAIT_FOR_GO = "while [ ! -e go ]; do sleep 0.05; done; echo went"


async def test_a_restarted_executor_reattaches_reports_once_and_never_starts_a_second_copy(
    tmp_path: Path, reports: Reports
) -> None:
    state = tmp_path / "state"
    workdir = tmp_path / "work"
    workdir.mkdir()
    start = order("r-re", launch(0, "sh", "-c", WAIT_FOR_GO, working_dir=str(workdir)))
    first = Executor(state, "n1", reports, poll_s=0.05)
    await first.apply(start)
    await reports.started("r-re")
    pids = first.runs["r-re"].procs[0].pids
    assert pids is not None
    await first.close()  # the agent goes away; its processes do not
    assert alive(pids.pid, pids.start)

    again = Reports()
    second = Executor(state, "n1", again, poll_s=0.05)
    try:
        assert await second.reattach() == ["r-re"]
        await second.apply(start)  # redelivered: starts nothing
        (workdir / "go").touch()
        exited = (await again.exits("r-re", 1))[0]
        assert (exited.exit_code, exited.stopped) == (0, None) and "went" in exited.log_tail
        await eventually(lambda: _over(second, "r-re"), what="the run is over")
        await second.apply(start)
        assert second.runs == {}
        assert again.of(ProcessesStarted) == [] and len(again.of(ProcessExited)) == 1
        assert reports.of(ProcessExited) == []
    finally:
        await second.close()

    third = Executor(state, "n1", Reports(), poll_s=0.05)
    assert await third.reattach() == []  # over and reported: nothing to pick up


async def _over(ex: Executor, run_id: str) -> bool:
    return run_id not in ex.runs


async def test_a_process_that_ended_while_the_agent_was_away_is_reported_from_its_exit_file(
    tmp_path: Path, reports: Reports
) -> None:
    state = tmp_path / "state"
    first = Executor(state, "n1", reports, poll_s=0.05)
    await first.apply(order("r-away", launch(0, "sh", "-c", "sleep 0.3; exit 5")))
    await reports.started("r-away")
    await first.close()
    rank_dir = state / "runs" / "r-away" / "rank-0"
    await eventually(lambda: _exists(rank_dir / "exit"), what="the shim records the exit")

    again = Reports()
    second = Executor(state, "n1", again, poll_s=0.05)
    try:
        await second.reattach()
        assert (await again.exits("r-away", 1))[0].exit_code == 5
    finally:
        await second.close()


async def _exists(path: Path) -> bool:
    return path.exists()


async def test_a_run_waits_for_its_gpus_until_the_other_runs_process_is_gone(
    executor: Executor, reports: Reports, tmp_path: Path
) -> None:
    await executor.apply(order("r-first", launch(0, "sh", "-c", WAIT_FOR_GO, gpus=[0, 1], working_dir=str(tmp_path))))
    await reports.started("r-first")
    await executor.apply(order("r-second", launch(0, "true", gpus=[1, 2])))
    await executor.apply(order("r-other", launch(0, "true", gpus=[3])))
    await reports.exits("r-other", 1)  # a run on other GPUs is not held up
    assert reports.of(ProcessesStarted, "r-second") == []
    assert executor.runs["r-second"].procs[0].pids is None

    (tmp_path / "go").touch()
    await reports.exits("r-second", 1)
    kinds = [(type(r).__name__, r.run_id) for _, r in reports.sent if r.run_id != "r-other"]
    assert kinds.index(("ProcessExited", "r-first")) < kinds.index(("ProcessesStarted", "r-second"))


async def test_a_run_waiting_for_gpus_that_is_stopped_never_starts(
    executor: Executor, reports: Reports, tmp_path: Path
) -> None:
    await executor.apply(order("r-hold", launch(0, "sh", "-c", WAIT_FOR_GO, gpus=[0], working_dir=str(tmp_path))))
    await reports.started("r-hold")
    await executor.apply(order("r-wait", launch(0, "true", gpus=[0])))
    cancel = StopRun(at=0.0, job_id="job-r-wait", tenant="acme", run_id="r-wait", node_id="n1", reason="cancelled")
    await executor.apply(cancel)
    exited = (await reports.exits("r-wait", 1))[0]
    assert (exited.exit_code, exited.stopped, exited.start_error) == (None, "cancelled", None)
    assert reports.of(ProcessesStarted, "r-wait") == []


async def test_the_simulated_workload_checkpoints_resumes_and_stops_on_sigterm(
    executor: Executor, reports: Reports
) -> None:
    env = {"TRAINYARD_SIMULATED_DURATION_S": "1000", "TRAINYARD_SIMULATED_CHECKPOINT_S": "0.2"}
    await executor.apply(order("r-ckpt", launch(0, env=env), resume_from_step=100))

    async def two_steps() -> list[int] | None:
        steps = [r.step for r in reports.of(CheckpointWritten, "r-ckpt")]
        return steps if len(steps) >= 2 else None

    steps = await eventually(two_steps, what="two checkpoints")
    assert steps == sorted(set(steps)) and steps[0] > 100
    ids = [i for i, r in reports.sent if isinstance(r, CheckpointWritten)]
    assert ids[0] == f"r-ckpt:n1:checkpoint:{steps[0]}"
    await executor.apply(
        StopRun(at=0.0, job_id="job-r-ckpt", tenant="acme", run_id="r-ckpt", node_id="n1", reason="preempted")
    )
    exited = (await reports.exits("r-ckpt", 1))[0]
    assert (exited.exit_code, exited.stopped) == (0, "preempted")
    assert "stopped at step" in exited.log_tail and "from step 100" in exited.log_tail


async def test_logs_are_captured_read_by_offset_and_rotated(tmp_path: Path, reports: Reports) -> None:
    ex = Executor(tmp_path / "state", "n1", reports, poll_s=0.05, checkpoint_poll_s=0.05, log_max_bytes=2000)
    chatty = "i=0; while [ $i -lt 400 ]; do echo line-$i; echo err-$i >&2; i=$((i+1)); sleep 0.005; done"
    try:
        await ex.apply(order("r-log", launch(2, "sh", "-c", chatty), attempt=3))
        exited = (await reports.exits("r-log", 1))[2]
    finally:
        await ex.close()
    path = runlogs.log_path(ex.state_dir, "job-r-log", 3, 2)
    assert path.with_name("rank-2.log.1").exists(), "the log was rotated"
    assert sorted(p.name for p in path.parent.iterdir()) == ["rank-2.log", "rank-2.log.1"], "one older part is kept"
    assert exited.log_tail.endswith("line-399\nerr-399\n")
    assert len(exited.log_tail.splitlines()) <= runlogs.TAIL_LINES and len(exited.log_tail) <= runlogs.TAIL_BYTES

    data, size = runlogs.read(ex.state_dir, "job-r-log", 3, 2, offset=0, limit=10)
    assert len(data) == 10 and size == path.stat().st_size
    data, _ = runlogs.read(ex.state_dir, "job-r-log", 3, 2, offset=-8, limit=100)
    assert data == b"err-399\n"


@pytest.mark.parametrize(
    ("job_id", "attempt", "rank", "limit", "error"),
    [
        pytest.param("../../etc", 1, 0, 10, ValueError, id="a job id that climbs out of the log directory"),
        pytest.param("job", -1, 0, 10, ValueError, id="a negative attempt"),
        pytest.param("job", 1, 0, 0, ValueError, id="a limit of nothing"),
        pytest.param("job", 1, 0, 10, FileNotFoundError, id="a rank without a log"),
    ],
)
def test_bad_log_reads_are_refused(
    tmp_path: Path, job_id: str, attempt: int, rank: int, limit: int, error: type
) -> None:
    with pytest.raises(error):
        runlogs.read(tmp_path, job_id, attempt, rank, 0, limit)


async def test_a_process_gone_with_its_shim_and_no_exit_status_is_a_failure_that_stops_its_peers(
    executor: Executor, reports: Reports
) -> None:
    await executor.apply(order("r-lost", launch(0, "sleep", "60"), launch(1, "sleep", "60")))
    await reports.started("r-lost")
    pids = executor.runs["r-lost"].procs[1].pids
    assert pids is not None
    os.kill(pids.shim_pid, signal.SIGKILL)
    os.killpg(pids.pid, signal.SIGKILL)

    exits = await reports.exits("r-lost", 2)
    lost = exits[1]
    assert (lost.exit_code, lost.signal, lost.start_error, lost.stopped) == (None, None, None, None)
    assert "gone without an exit status" in lost.log_tail
    assert exits[0].stopped == "peer_failed"


async def test_a_resumed_simulated_workload_does_only_what_is_left(executor: Executor, reports: Reports) -> None:
    env = {"TRAINYARD_SIMULATED_DURATION_S": "30", "TRAINYARD_SIMULATED_CHECKPOINT_S": "5"}
    await executor.apply(order("r-rest", launch(0, env=env), resume_from_step=29))
    exited = (await reports.exits("r-rest", 1))[0]
    assert (exited.exit_code, exited.stopped) == (0, None)
    assert "1s of 30s left, from step 29" in exited.log_tail and "done at step 30" in exited.log_tail
    assert [r.step for r in reports.of(CheckpointWritten, "r-rest")] == [30]


async def test_a_run_with_an_image_goes_through_the_container_runtime_template(tmp_path: Path) -> None:
    runtime = tmp_path / "fake-runtime"
    runtime.write_text('#!/bin/sh\necho "runtime got: $*"\necho "RANK in its environment: $RANK"\n')
    runtime.chmod(0o755)
    reports = Reports()
    template = f"{runtime} run --gpus device={{gpus}} -w {{workdir}} {{env}} {{image}}"
    ex = Executor(tmp_path / "state", "n1", reports, container_runtime=template, poll_s=0.05)
    try:
        job = launch(0, "python", "train.py", gpus=[2, 3], env={"RANK": "0"})
        await ex.apply(order("r-img", job, image="pytorch:24.05"))
        exited = (await reports.exits("r-img", 1))[0]
    finally:
        await ex.close()
    workdir = ex.state_dir / "work" / "r-img"
    assert f"runtime got: run --gpus device=2,3 -w {workdir} " in exited.log_tail
    assert "-e RANK " in exited.log_tail and "pytorch:24.05 python train.py" in exited.log_tail
    assert "RANK in its environment: 0" in exited.log_tail
