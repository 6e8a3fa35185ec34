"""Run execution messages between the run dispatcher and node agents (WORK stream).

A node agent reads only its own orders, on ``trainyard.work.<cluster>.<node_id>.orders``
(written by the run dispatcher in the placement service), and writes only its own
reports, on ``trainyard.work.<cluster>.<node_id>.reports``.  The dispatcher turns
``JobPlaced``, ``PreemptionNotice``, ``JobCancelled`` and ``RunFailed`` on JOBS into
orders for each node of the run, and the nodes' reports into the run's lifecycle
events (``RunStarted`` once every process of every node is up, one ``RunFailed``
naming the first rank that failed, ``RunSucceeded`` once every rank exited 0,
``CheckpointSaved``).  Every order and report carries the run id, so a late or
duplicated message about an old attempt changes nothing.

What the processes of a run see is decided once, by the pure planner
(:mod:`trainyard.core.execution`): a ``StartRun`` carries each process's argv,
its whole environment of the torch.distributed contract, its GPUs and working
directory, so the agent adds nothing but its local paths (logs, checkpoints).
"""

from __future__ import annotations

from typing import Literal

import msgspec

#: Signals a job may ask for before it is stopped (its preemption signal).
STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGHUP", "SIGQUIT")

StopReason = Literal["cancelled", "timeout", "preempted", "peer_failed", "run_over", "lost", "start_timeout"]


class _Work(msgspec.Struct, tag_field="type", kw_only=True, frozen=True):
    at: float  # when the producer decided this, seconds since the Unix epoch
    job_id: str
    tenant: str
    run_id: str
    node_id: str


class ProcessLaunch(msgspec.Struct, frozen=True, kw_only=True):
    """One process of a run on one node, as the planner decided it."""

    rank: int  # the process's RANK (per GPU) or NODE_RANK (launcher per replica)
    role: str
    replica: int  # the replica of its role this process belongs to
    gpus: list[int]  # indices of the node's GPUs this process may use
    argv: list[str]  # the command; argv[0] is looked up on PATH
    env: dict[str, str]  # the whole environment contract and the role's env
    working_dir: str | None = None  # None: the agent's per-run directory


# --- orders: dispatcher -> one node's agent ---


class StartRun(_Work, tag="StartRun", frozen=True):
    """Start every process of the run placed on this node."""

    attempt: int
    cluster: str
    processes: list[ProcessLaunch]
    image: str | None = None  # run inside the node's container runtime when it has one
    stop_signal: str = "SIGTERM"  # delivered on preemption, cancel and time limit
    stop_grace_s: float = 30.0  # after the signal, the process group is killed
    checkpoint_dir: str | None = None  # None: the agent's directory for the job
    resume_from_step: int | None = None
    max_runtime_s: float | None = None  # the agent stops the run after this long, as a backstop


class SignalRun(_Work, tag="SignalRun", frozen=True):
    """A preemption notice: deliver ``signal`` to every process now, kill what
    is left after ``grace_period_s``."""

    signal: str = "SIGTERM"
    grace_period_s: float = 30.0
    reason: str = "preempted"


class StopRun(_Work, tag="StopRun", frozen=True):
    """Stop the run's processes on this node (signal, grace, kill)."""

    reason: StopReason
    signal: str = "SIGTERM"
    grace_period_s: float = 30.0


WorkOrder = StartRun | SignalRun | StopRun


# --- reports: one node's agent -> dispatcher ---


class ProcessesStarted(_Work, tag="ProcessesStarted", frozen=True):
    """Every process of the run on this node was started."""

    ranks: list[int]
    pids: list[int]
    boot_id: str = ""


class ProcessExited(_Work, tag="ProcessExited", frozen=True):
    """One process of the run ended (or could not start)."""

    rank: int
    exit_code: int | None = None  # None: killed by a signal or never started
    signal: str | None = None  # the signal that ended it
    start_error: str | None = None  # why it could not start (missing binary, bad directory)
    stopped: StopReason | None = None  # it was stopped by the agent, and why
    log_tail: str = ""  # the last lines of its output
    exited_at: float | None = None  # when it ended, by the node's clock (None: not known); ``at`` is when it was seen

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.start_error is None


class CheckpointWritten(_Work, tag="CheckpointWritten", frozen=True):
    """The run reported a saved checkpoint (the step file under its checkpoint directory)."""

    step: int


WorkReport = ProcessesStarted | ProcessExited | CheckpointWritten

WorkMessage = StartRun | SignalRun | StopRun | ProcessesStarted | ProcessExited | CheckpointWritten

_decoder: msgspec.json.Decoder[WorkMessage] = msgspec.json.Decoder(WorkMessage)


def decode_work(data: bytes) -> WorkMessage:
    """Raises ``msgspec.ValidationError`` / ``DecodeError`` on bad input."""
    try:
        return _decoder.decode(data)
    except RecursionError as err:
        raise msgspec.DecodeError("JSON is nested too deeply") from err
