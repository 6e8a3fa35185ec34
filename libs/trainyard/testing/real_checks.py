"""Checks on real job processes while and after they run: no job with live
processes of two runs at once, no GPU of a node held by live processes of two
runs, and the ledger's interval of each run against the one its processes
measured.  Used by the real-process chaos run (``bench/chaos.py --real``).

The live processes come from /proc (:func:`trainyard.testing.procs.job_processes`:
the job's environment names its run, its GPUs and, through its checkpoint or
working directory, its node).  A run's measured interval comes from the agents'
state directories: the earliest start of its processes (their ``pid`` files
hold the start time from /proc) to the latest write of an ``exit`` file (the
shim writes it when the command exits)."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from pathlib import Path

import msgspec

from trainyard.ledger import Ledger
from trainyard.testing.procs import boot_epoch, job_processes, started_at


class LiveChecks(msgspec.Struct):
    samples: int = 0
    max_live: int = 0  # the most live job processes seen in one sample
    twice_at_once: dict[str, list[str]] = {}  # job -> the runs seen live together
    gpu_shared: dict[str, list[str]] = {}  # "<node>/gpu<i>" -> the runs seen holding it together


def sample(agents_dir: str, checks: LiveChecks) -> None:
    """One look at /proc, folded into ``checks``."""
    runs_of_job: dict[str, set[str]] = defaultdict(set)
    runs_of_gpu: dict[str, set[str]] = defaultdict(set)
    live = 0
    for p in job_processes(agents_dir):
        live += 1
        runs_of_job[p.job_id].add(p.run_id)
        for gpu in p.gpus:
            runs_of_gpu[f"{p.node_id}/gpu{gpu}"].add(p.run_id)
    checks.samples += 1
    checks.max_live = max(checks.max_live, live)
    for job, runs in runs_of_job.items():
        if len(runs) > 1:
            checks.twice_at_once[job] = sorted(set(checks.twice_at_once.get(job, [])) | runs)
    for gpu, runs in runs_of_gpu.items():
        if len(runs) > 1:
            checks.gpu_shared[gpu] = sorted(set(checks.gpu_shared.get(gpu, [])) | runs)


async def watch(agents_dir: str, checks: LiveChecks, stop: asyncio.Event, every_s: float = 0.2) -> None:
    """Sample every ``every_s`` seconds until ``stop`` is set."""
    while not stop.is_set():
        await asyncio.to_thread(sample, agents_dir, checks)
        try:
            await asyncio.wait_for(stop.wait(), every_s)
        except TimeoutError:
            pass


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def measured_intervals(agents_dir: str, booted: float | None = None) -> dict[str, tuple[float, float]]:
    """Run id -> (first process start, last process exit) in Unix time, for
    every run whose every process on every node has a pid and an exit that is
    an exit code or a signal (not a start error, not lost).  ``booted``: the
    machine's boot time (:func:`boot_epoch`, read once so that checks repeat exactly)."""
    booted = boot_epoch() if booted is None else booted
    starts: dict[str, list[float]] = defaultdict(list)
    ends: dict[str, list[float]] = defaultdict(list)
    broken: set[str] = set()
    for rank_dir in Path(agents_dir).glob("*/runs/*/rank-*"):
        run_id = rank_dir.parent.name
        pid, exit = _read(rank_dir / "pid"), _read(rank_dir / "exit")
        if not pid or not exit or not exit.startswith(("exit", "signal")):
            broken.add(run_id)
            continue
        starts[run_id].append(started_at(int(pid.split()[1]), booted))
        ends[run_id].append((rank_dir / "exit").stat().st_mtime)
    return {run: (min(starts[run]), max(ends[run])) for run in starts if run not in broken}


class LedgerCheck(msgspec.Struct):
    compared: int  # runs both metered by the ledger and measured on the nodes
    over: dict[str, float]  # run -> ledger duration minus measured duration, where more than the tolerance
    max_abs_s: float  # the largest difference
    mean_s: float  # the mean signed difference


def check_ledger(
    ledger_url: str, agents_dir: str, tolerance_s: float = 1.0, booted: float | None = None
) -> LedgerCheck:
    """Each run's duration in the ledger against its processes' measured interval."""
    measured = measured_intervals(agents_dir, booted)
    ledger = Ledger(ledger_url)
    try:
        runs = ledger.runs()
    finally:
        ledger.close()
    diffs: dict[str, float] = {}
    for run in runs:
        if run.run_id in measured and run.started_at is not None and run.ended_at is not None:
            start, end = measured[run.run_id]
            diffs[run.run_id] = (run.ended_at - run.started_at) - (end - start)
    return LedgerCheck(
        compared=len(diffs),
        over={run: round(d, 3) for run, d in diffs.items() if abs(d) > tolerance_s},
        max_abs_s=max((abs(d) for d in diffs.values()), default=0.0),
        mean_s=sum(diffs.values()) / len(diffs) if diffs else 0.0,
    )


def near_kills(agents_dir: str, runs: set[str], killed: list[tuple[str, float]], margin_s: float = 1.0) -> set[str]:
    """Those of ``runs`` with a process on a node whose agent was killed
    (``killed``: node, Unix time) while they ran, give or take ``margin_s``."""
    measured = measured_intervals(agents_dir)
    found = set()
    for run in runs & set(measured):
        start, end = measured[run]
        nodes = {path.parent.parent.name for path in Path(agents_dir).glob(f"*/runs/{run}")}
        if any(node in nodes and start - margin_s <= at <= end + margin_s for node, at in killed):
            found.add(run)
    return found
