"""The executor with real processes: environment, start errors, exit codes,
signals and grace, no process left behind, the local gang."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
from agent_fixtures import Reports, group_members, launch, order

from trainyard.agent import processes
from trainyard.agent.executor import Executor
from trainyard.agent.processes import alive
from trainyard.events.work import ProcessesStarted, ProcessExited, SignalRun, StopRun
from trainyard.testing.waiting import eventually

WAIT_FOR_SIGNAL = "trap 'echo got $0; exit 7' USR1; echo ready; while :; do sleep 0.05; done"


def stop(run_id: str, reason: str = "cancelled", grace: float = 5.0, sig: str = "SIGTERM") -> StopRun:
    return StopRun(
        at=0.0,
        job_id=f"job-{run_id}",
        tenant="acme",
        run_id=run_id,
        node_id="n1",
        reason=reason,  # type: ignore[arg-type]
        signal=sig,
        grace_period_s=grace,
    )


async def log_says(path: Path, text: str) -> None:
    await eventually(lambda: _contains(path, text), what=f"{path.name} says {text!r}")


async def _contains(path: Path, text: str) -> bool:
    return path.exists() and text in path.read_text()


async def test_the_job_environment_holds_the_launch_and_nothing_of_the_agent(
    executor: Executor, reports: Reports, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINYARD_NATS_URL", "nats://agent:secret@bus:4222")
    monkeypatch.setenv("TRAINYARD_REDIS_PASSWORD", "hunter2")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t")
    env = {"RANK": "3", "WORLD_SIZE": "4", "CUDA_VISIBLE_DEVICES": "1"}
    await executor.apply(order("r-env", launch(3, "env", env=env), resume_from_step=42))

    exited = (await reports.exits("r-env", 1))[3]
    assert exited.exit_code == 0 and exited.start_error is None
    seen = dict(line.split("=", 1) for line in exited.log_tail.splitlines() if "=" in line)
    assert {k: seen[k] for k in env} == env
    assert seen["TRAINYARD_CHECKPOINT_DIR"] == str(executor.state_dir / "checkpoints" / "acme" / "job-r-env")
    assert seen["TRAINYARD_RESUME_STEP"] == "42"
    assert {"PATH", "HOME", "LANG", "USER", "LOGNAME"} <= seen.keys()
    assert not {"TRAINYARD_NATS_URL", "TRAINYARD_REDIS_PASSWORD", "AWS_SECRET_ACCESS_KEY"} & seen.keys()
    assert "secret" not in exited.log_tail and "hunter2" not in exited.log_tail
    assert Path(seen["TRAINYARD_CHECKPOINT_DIR"]).is_dir()


@pytest.mark.parametrize(
    ("argv", "working_dir", "reason"),
    [
        pytest.param(["no-such-binary-anywhere"], None, "not found", id="a missing binary fails with a clear reason"),
        pytest.param(["true"], "/nonexistent/dir", "working directory", id="a missing working directory fails"),
        pytest.param(
            [], None, "gives no command", id="an image without a command on a node without a container runtime fails"
        ),
    ],
)
async def test_a_process_that_cannot_start_fails_its_run_and_stops_its_peers(
    executor: Executor, reports: Reports, argv: list[str], working_dir: str | None, reason: str
) -> None:
    peer = launch(0, "sleep", "60")
    bad = launch(1, *argv, working_dir=working_dir)
    begun = time.monotonic()
    await executor.apply(order("r-bad", peer, bad))

    exits = await reports.exits("r-bad", 2)
    print(f"start error reported after {time.monotonic() - begun:.3f}s")
    assert reason in (exits[1].start_error or "") and exits[1].exit_code is None and exits[1].stopped is None
    assert exits[0].stopped == "peer_failed" and exits[0].signal == "SIGTERM"
    assert reports.of(ProcessesStarted) == []


@pytest.mark.parametrize(
    ("script", "exit_code", "signal"),
    [
        pytest.param("exit 0", 0, None, id="exit 0"),
        pytest.param("exit 3", 3, None, id="exit 3 is reported as 3"),
        pytest.param("kill -USR2 $$", None, "SIGUSR2", id="death by a signal is reported by its name"),
    ],
)
async def test_exit_codes_and_signals_are_reported(
    executor: Executor, reports: Reports, script: str, exit_code: int | None, signal: str | None
) -> None:
    await executor.apply(order("r-exit", launch(0, "sh", "-c", script)))
    exited = (await reports.exits("r-exit", 1))[0]
    assert (exited.exit_code, exited.signal, exited.stopped) == (exit_code, signal, None)
    assert reports.of(type(exited)) == [exited]


async def test_signal_run_reaches_every_process_group_and_marks_the_exits(executor: Executor, reports: Reports) -> None:
    await executor.apply(order("r-sig", launch(0, "sh", "-c", WAIT_FOR_SIGNAL), launch(1, "sh", "-c", WAIT_FOR_SIGNAL)))
    await reports.started("r-sig")
    for rank in (0, 1):
        await log_says(executor.runs["r-sig"].procs[rank].log, "ready")
    notice = SignalRun(at=0.0, job_id="job-r-sig", tenant="acme", run_id="r-sig", node_id="n1", signal="SIGUSR1")
    begun = time.monotonic()
    await executor.apply(notice)

    exits = await reports.exits("r-sig", 2)
    print(f"signal to exit reported: {time.monotonic() - begun:.3f}s")
    assert [(e.exit_code, e.stopped) for e in exits.values()] == [(7, "preempted"), (7, "preempted")]
    assert "got sh" in exits[0].log_tail


async def test_a_process_ignoring_sigterm_is_killed_after_the_grace(executor: Executor, reports: Reports) -> None:
    stubborn = "trap '' TERM; echo ready; while :; do sleep 0.05; done"
    await executor.apply(order("r-grace", launch(0, "sh", "-c", stubborn)))
    await reports.started("r-grace")
    await log_says(executor.runs["r-grace"].procs[0].log, "ready")
    begun = time.monotonic()
    await executor.apply(stop("r-grace", grace=1.0))

    exited = (await reports.exits("r-grace", 1))[0]
    took = time.monotonic() - begun
    print(f"killed {took:.3f}s after the stop (grace 1.0s)")
    assert (exited.signal, exited.stopped) == ("SIGKILL", "cancelled")
    assert took >= 1.0, "it was killed before its grace period was over"


async def test_nothing_of_a_stopped_run_is_left_in_proc(executor: Executor, reports: Reports) -> None:
    forks = "sleep 1000 & sleep 1000 & echo ready; wait"
    await executor.apply(order("r-left", launch(0, "sh", "-c", forks), launch(1, "sh", "-c", forks)))
    await reports.started("r-left")
    run = executor.runs["r-left"]
    for p in run.procs:
        await log_says(p.log, "ready")
    pids = [p.pids for p in run.procs if p.pids is not None]
    assert all(len(group_members(p.pid)) == 3 for p in pids)
    await executor.apply(stop("r-left", grace=0.5, sig="SIGHUP"))

    exits = await reports.exits("r-left", 2)
    assert {e.stopped for e in exits.values()} == {"cancelled"}
    for p in pids:
        assert group_members(p.pid) == []
        assert not alive(p.shim_pid, p.shim_start)
    assert "r-left" not in executor.runs


async def test_a_failed_rank_stops_the_other_ranks_of_its_run(executor: Executor, reports: Reports) -> None:
    await executor.apply(order("r-gang", launch(0, "sleep", "60"), launch(1, "sh", "-c", "exit 3")))
    exits = await reports.exits("r-gang", 2)
    assert (exits[1].exit_code, exits[1].stopped) == (3, None)
    assert (exits[0].signal, exits[0].stopped) == ("SIGTERM", "peer_failed")


async def test_max_runtime_stops_the_run(executor: Executor, reports: Reports) -> None:
    await executor.apply(order("r-limit", launch(0, "sleep", "60"), max_runtime_s=0.5, stop_grace_s=1.0))
    exited = (await reports.exits("r-limit", 1))[0]
    assert (exited.signal, exited.stopped) == ("SIGTERM", "timeout")


async def test_a_stop_before_the_start_means_it_never_starts(executor: Executor, reports: Reports) -> None:
    await executor.apply(stop("r-late"))
    await executor.apply(order("r-late", launch(0, "sleep", "60")))
    assert executor.runs == {} and reports.sent == []
    assert os.listdir(executor.run_dir("r-late")) == ["done"]


async def test_a_start_order_older_than_the_limit_is_never_started(executor: Executor, reports: Reports) -> None:
    await executor.apply(order("r-old", launch(0, "sleep", "60"), at=time.time() - 3600))
    await executor.apply(order("r-old", launch(0, "sleep", "60")))  # the same run, ordered again now: still not
    assert executor.runs == {} and reports.sent == []
    assert os.listdir(executor.run_dir("r-old")) == ["done"]


async def test_a_stop_while_the_processes_are_starting_reaches_them_once_started(
    executor: Executor, reports: Reports, monkeypatch: pytest.MonkeyPatch
) -> None:
    entered, gate = asyncio.Event(), asyncio.Event()
    real_spawn = processes.spawn

    async def held_spawn(*args, **kwargs):  # type: ignore[no-untyped-def]
        entered.set()
        await gate.wait()
        return await real_spawn(*args, **kwargs)

    monkeypatch.setattr(processes, "spawn", held_spawn)
    await executor.apply(order("r-mid", launch(0, "sleep", "60")))
    await entered.wait()
    await executor.apply(stop("r-mid", grace=60))
    gate.set()
    exited = (await reports.exits("r-mid", 1))[0]
    assert (exited.signal, exited.stopped) == ("SIGTERM", "cancelled")


async def test_exits_seen_together_are_reported_in_the_order_they_happened(tmp_path: Path, reports: Reports) -> None:
    # A poll slower than the two exits: rank 1 fails first and rank 0 fails because of it
    # (as a peer whose connection dropped does); the run's failure must name rank 1.
    slow = Executor(tmp_path / "slow", "n1", reports, boot_id="b1", poll_s=1.5, checkpoint_poll_s=5.0)
    marker = tmp_path / "rank-1-failing"
    try:
        rank0 = launch(0, "sh", "-c", f"while [ ! -e {marker} ]; do sleep 0.01; done; sleep 0.2; exit 1")
        rank1 = launch(1, "sh", "-c", f"sleep 0.2; touch {marker}; exit 3")
        await slow.apply(order("r-order", rank0, rank1))
        await reports.exits("r-order", 2)
        exits = reports.of(ProcessExited, "r-order")
        assert [e.rank for e in exits] == [1, 0] and exits[0].exit_code == 3
        # Each report says when its process ended, not when the poll saw it: 0.2 s apart, both before the poll.
        ended = [e.exited_at for e in exits]
        assert ended[0] is not None and ended[1] is not None
        assert ended[0] + 0.1 < ended[1] < exits[0].at
    finally:
        await slow.close()
