"""What the job pages compute from a job and its runs: the run history with
each run's real state and live GPU-hours, a job's elapsed time and its nodes,
and which states may be cancelled.  Pure: the caller passes the time."""

from __future__ import annotations

from dataclasses import dataclass

from trainyard.ledger.records import LedgerRun
from trainyard.store.views import TERMINAL
from trainyard_gateway.schema import JobView

#: The states a job may be cancelled in (the API answers 409 for the others).
CANCELLABLE = ("pending", "admitted", "placed", "running")


@dataclass(frozen=True)
class RunRow:
    """One row of a job's run history."""

    run_id: str
    attempt: int | None
    gpus: int
    placed_at: float | None
    started_at: float | None
    ended_at: float | None
    state: str  # placed | running | stopping | succeeded | failed:<reason> | cancelled
    gpu_hours: float
    live: bool  # still metering: the page counts the GPU-hours up as time passes


def may_be_cancelled(job: JobView) -> bool:
    return job.status in CANCELLABLE


def _open_state(job: JobView, run_id: str, started_at: float | None) -> tuple[str, float | None]:
    """An open run's state, and when it stopped counting (None: it still counts).
    The ledger closes a run only once its processes have stopped; the job's own
    record knows sooner that it was cancelled, failed or moved on."""
    if run_id != job.run_id:
        return "stopping", job.placed_at or job.finished_at  # a later attempt has started
    if job.status in TERMINAL:
        return "stopping" if job.status == "cancelled" else job.status, job.finished_at
    return ("running" if started_at is not None else "placed"), None


def run_rows(job: JobView | None, runs: list[LedgerRun], now: float) -> list[RunRow]:
    """The run history, oldest first: the ledger's runs, each open one with the
    state the job's record knows and its GPU-hours so far, and the job's current
    run when the ledger has not metered it yet."""
    rows = []
    for r in runs:
        if r.ended_at is not None or job is None:
            hours = (r.gpu_seconds or 0.0) / 3600.0
            rows.append(
                RunRow(
                    r.run_id,
                    r.attempt,
                    r.gpus,
                    r.placed_at,
                    r.started_at,
                    r.ended_at,
                    r.outcome or "ended",
                    hours,
                    False,
                )
            )
            continue
        state, stopped = _open_state(job, r.run_id, r.started_at)
        until = stopped if stopped is not None else now
        hours = r.gpus * max(0.0, until - r.started_at) / 3600.0 if r.started_at is not None else 0.0
        rows.append(RunRow(r.run_id, r.attempt, r.gpus, r.placed_at, r.started_at, None, state, hours, stopped is None))
    if job is not None and job.run_id and job.run_id not in {r.run_id for r in runs}:
        state, stopped = _open_state(job, job.run_id, job.started_at)
        until = stopped if stopped is not None else now
        started = job.started_at
        hours = job.gpus * max(0.0, until - started) / 3600.0 if started is not None else 0.0
        live = stopped is None and started is not None
        rows.append(RunRow(job.run_id, job.attempt, job.gpus, job.placed_at, started, None, state, hours, live))
    return rows


def runs_signature(rows: list[RunRow]) -> str:
    """What the run history shows that changes other than by the clock."""
    return ";".join(f"{r.run_id}|{r.state}|{r.ended_at}" for r in rows)


def elapsed(job: JobView, now: float) -> tuple[float | None, bool]:
    """How long the job has run (start to end, or to now while it runs), and
    whether that is still counting; (None, False) before it started."""
    if job.started_at is None:
        return None, False
    if job.finished_at is not None:
        return max(0.0, job.finished_at - job.started_at), False
    return max(0.0, now - job.started_at), job.status == "running"


def nodes_of(job: JobView) -> list[str]:
    """The nodes the job's ranks run on, in rank order, each once."""
    return list(dict.fromkeys(r.node_id for r in job.placement or []))
