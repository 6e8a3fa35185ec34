"""What the agent keeps about a run on disk, so that a restarted agent finds
it again and never starts it twice.

    <state>/runs/<run_id>/order.json        the StartRun (its directory existing
                                            is what makes StartRun idempotent)
    <state>/runs/<run_id>/started-at        when its processes were started (Unix time)
    <state>/runs/<run_id>/stopping          "<reason> <kill at>": the agent is stopping it
    <state>/runs/<run_id>/started-reported  ProcessesStarted was published
    <state>/runs/<run_id>/checkpoint        the last step reported
    <state>/runs/<run_id>/done              every process ended and was reported
    <state>/runs/<run_id>/rank-<r>/         pid, exit (see processes.py), reported

A StopRun for a run this node never saw leaves a directory with ``done`` only:
a StartRun delivered after it starts nothing.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from trainyard.agent.processes import Exit, Pids, read_exit, read_pids, read_text
from trainyard.events.work import ProcessLaunch, StartRun


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


@dataclass(eq=False)
class Proc:
    """One process of a run on this node."""

    launch: ProcessLaunch
    dir: Path  # <run>/rank-<r>
    log: Path  # its log file
    pids: Pids | None = None  # once started
    exit: Exit | None = None  # once ended (or failed to start)
    shim: asyncio.subprocess.Process | None = None  # this agent's child, reaped on exit
    stopped: str | None = None  # why the agent stopped it, decided when it ended
    reported: bool = False  # its ProcessExited was handed to the outbox
    sent: bool = False  # ... and the stream has it

    @property
    def rank(self) -> int:
        return self.launch.rank

    @property
    def live(self) -> bool:
        """Started and not yet known to have ended (its GPUs are held)."""
        return self.pids is not None and self.exit is None

    @property
    def failed(self) -> bool:
        return self.exit is not None and not self.exit.ok


@dataclass(eq=False)
class Run:
    order: StartRun
    dir: Path
    procs: list[Proc]
    checkpoint_dir: Path
    started_at: float | None = None  # when the processes were started (Unix time)
    stopping: str | None = None  # why the agent is stopping it
    stop_signal: str | None = None  # the signal it was last told to stop with (this agent's life)
    kill_at: float | None = None  # when what is left is SIGKILLed (Unix time)
    checkpoint_step: int | None = None  # the last step reported
    started_reported: bool = False
    claimed: bool = False  # its GPUs are taken (it started, or is starting)
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def run_id(self) -> str:
        return self.order.run_id

    @property
    def gpus(self) -> set[int]:
        return {g for p in self.procs for g in p.launch.gpus}

    @property
    def held_gpus(self) -> set[int]:
        return {g for p in self.procs if self.claimed and p.exit is None for g in p.launch.gpus}

    @property
    def over(self) -> bool:
        return all(p.exit is not None and p.sent for p in self.procs)

    # --- on disk ---

    def mark(self, name: str, text: str = "") -> None:
        write_atomic(self.dir / name, text)

    def save_stopping(self) -> None:
        self.mark("stopping", f"{self.stopping} {self.kill_at}\n")


def create(run_dir: Path, order: StartRun) -> bool:
    """Make the run's directory and record its order; False when it exists
    (the run was seen before, whatever became of it)."""
    try:
        run_dir.mkdir(parents=True)
    except FileExistsError:
        return False
    write_atomic(run_dir / "order.json", msgspec.json.encode(order).decode())
    for p in order.processes:
        (run_dir / f"rank-{p.rank}").mkdir()
    return True


def tombstone(run_dir: Path) -> bool:
    """Record a run that must never start here; False when it exists."""
    try:
        run_dir.mkdir(parents=True)
    except FileExistsError:
        return False
    write_atomic(run_dir / "done", "")
    return True


def load_order(run_dir: Path) -> StartRun | None:
    """The order of a recorded run that is not over; None when it is over
    (or a tombstone).  Raises ValueError for an order that cannot be read."""
    if (run_dir / "done").exists():
        return None
    text = read_text(run_dir / "order.json")
    return None if text is None else msgspec.json.decode(text, type=StartRun)


def load(run_dir: Path, order: StartRun, logs: dict[int, Path], checkpoint_dir: Path) -> Run:
    """A recorded run as it stands on disk."""
    procs = []
    for launch in order.processes:
        rank_dir = run_dir / f"rank-{launch.rank}"
        procs.append(
            Proc(
                launch,
                rank_dir,
                logs[launch.rank],
                pids=read_pids(rank_dir),
                exit=read_exit(rank_dir),
                reported=(sent := (rank_dir / "reported").exists()),
                sent=sent,
            )
        )
    run = Run(order, run_dir, procs, checkpoint_dir)
    if started := read_text(run_dir / "started-at"):
        run.started_at = float(started)
        run.claimed = True
    if stopping := read_text(run_dir / "stopping"):
        parts = stopping.split()
        run.stopping = parts[0]
        run.kill_at = float(parts[1]) if len(parts) > 1 and parts[1] != "None" else None
    if step := read_text(run_dir / "checkpoint"):
        run.checkpoint_step = int(step)
    run.started_reported = (run_dir / "started-reported").exists()
    return run
