"""The real-process chaos checks (bench/chaos.py --real): live job processes
found in /proc by their environment, and runs' measured intervals read from
an agent's state directory."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainyard.testing.procs import CLOCK_TICKS, boot_epoch, node_of
from trainyard.testing.real_checks import LiveChecks, measured_intervals, near_kills, sample


@pytest.fixture
def job_procs(tmp_path: Path) -> Iterator[list[subprocess.Popen]]:
    procs: list[subprocess.Popen] = []
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def start(procs: list[subprocess.Popen], agents: Path, node: str, job: str, run: str, gpus: str) -> None:
    cwd = agents / node / "work" / run
    cwd.mkdir(parents=True, exist_ok=True)
    env = {"PATH": os.environ["PATH"], "TRAINYARD_JOB_ID": job, "TRAINYARD_RUN_ID": run, "CUDA_VISIBLE_DEVICES": gpus}
    procs.append(subprocess.Popen(["sleep", "30"], cwd=cwd, env=env))


def test_two_runs_of_one_job_and_one_gpu_held_by_two_runs_are_seen_live(
    tmp_path: Path, job_procs: list[subprocess.Popen]
) -> None:
    agents = tmp_path / "agents"
    start(job_procs, agents, "a00", "j1", "j1-r1", "0,1")
    start(job_procs, agents, "a01", "j1", "j1-r2", "0")  # the same job's next run, elsewhere, at once
    start(job_procs, agents, "a00", "j2", "j2-r1", "1")  # GPU 1 of a00 again
    start(job_procs, agents, "a01", "j3", "j3-r1", "1")  # another node's GPU 1: no conflict
    checks = LiveChecks()
    sample(str(agents), checks)
    assert checks.max_live == 4
    assert checks.twice_at_once == {"j1": ["j1-r1", "j1-r2"]}
    assert checks.gpu_shared == {"a00/gpu1": ["j1-r1", "j2-r1"]}


def test_processes_of_another_stack_are_not_counted(tmp_path: Path, job_procs: list[subprocess.Popen]) -> None:
    start(job_procs, tmp_path / "other" / "agents", "a00", "j1", "j1-r1", "0")
    checks = LiveChecks()
    sample(str(tmp_path / "agents"), checks)
    assert (checks.samples, checks.max_live) == (1, 0)


def test_a_runs_interval_runs_from_its_first_process_start_to_its_last_exit(tmp_path: Path) -> None:
    booted = boot_epoch()
    run = tmp_path / "agents"
    ticks = int((time.time() - 10 - booted) * CLOCK_TICKS)
    for node, rank, start_ticks, exit_at, exit in [
        ("a00", 0, ticks, time.time() - 5, "exit 0"),
        ("a01", 1, ticks + 2 * CLOCK_TICKS, time.time() - 3, "signal 15"),
    ]:
        rank_dir = run / node / "runs" / "j1-r1" / f"rank-{rank}"
        rank_dir.mkdir(parents=True)
        (rank_dir / "pid").write_text(f"100 {start_ticks} 99 {start_ticks}\n")
        (rank_dir / "exit").write_text(exit + "\n")
        os.utime(rank_dir / "exit", (exit_at, exit_at))
    lost = run / "a00" / "runs" / "j2-r1" / "rank-0"
    lost.mkdir(parents=True)
    (lost / "pid").write_text(f"100 {ticks} 99 {ticks}\n")
    (lost / "exit").write_text("lost\n")
    got = measured_intervals(str(run), booted)
    assert set(got) == {"j1-r1"}, "a run with a process that was lost has no measured end"
    start, end = got["j1-r1"]
    assert end - start == pytest.approx(7.0, abs=0.05)


def test_a_node_is_named_by_the_agent_directory_that_holds_the_path() -> None:
    assert node_of("/d/agents/a03/checkpoints/acme/j1", "/d/agents") == "a03"
    assert node_of("/elsewhere/a03", "/d/agents") == ""


def test_runs_off_in_the_ledger_are_traced_to_an_agent_killed_on_their_node_while_they_ran(tmp_path: Path) -> None:
    booted, now = boot_epoch(), time.time()
    for node, run in [("a00", "j1-r1"), ("a01", "j2-r1")]:
        rank_dir = tmp_path / node / "runs" / run / "rank-0"
        rank_dir.mkdir(parents=True)
        ticks = int((now - 10 - booted) * CLOCK_TICKS)
        (rank_dir / "pid").write_text(f"100 {ticks} 99 {ticks}\n")
        (rank_dir / "exit").write_text("exit 0\n")
        os.utime(rank_dir / "exit", (now - 2, now - 2))
    killed = [("a00", now - 5), ("a01", now - 60)]  # a01's agent was killed long before its run
    assert near_kills(str(tmp_path), {"j1-r1", "j2-r1"}, killed) == {"j1-r1"}
