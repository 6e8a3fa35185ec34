"""Runs whose time is up: a preemption victim past its grace period, and a gang
that placement did not place within the placement timeout."""

from __future__ import annotations

import msgspec

ACTIVE = ("admitted", "placed", "running")


class HeldRun(msgspec.Struct, frozen=True):
    """A job's current run while it holds quota."""

    job_id: str
    status: str  # admitted, placed or running
    admitted_at: float | None
    preempt_deadline: float | None = None  # from its preemption notice, if it got one


class Stop(msgspec.Struct, frozen=True):
    job_id: str
    reason: str  # "preempted" or "placement_timeout" (a RunFailed reason)


def overdue(runs: list[HeldRun], now: float, placement_timeout_s: float) -> list[Stop]:
    """Which runs to stop now, and why; a victim's deadline wins over a timeout."""
    stops = []
    for run in runs:
        if run.status not in ACTIVE:
            continue
        if run.preempt_deadline is not None and now >= run.preempt_deadline:
            stops.append(Stop(run.job_id, "preempted"))
        elif run.status == "admitted" and run.admitted_at is not None and now >= run.admitted_at + placement_timeout_s:
            stops.append(Stop(run.job_id, "placement_timeout"))
    return stops
