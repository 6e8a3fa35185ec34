"""Runs whose time is up: a preemption victim past its grace period, a run past
its run-time limit, and a gang that placement did not place within the
placement timeout.

A run is stopped at ``started_at + max_runtime_s`` with ``RunFailed(timeout)``,
as the simulator stops it; the fold counts that as the job's own failure
(``failure_category``): retried after a backoff while retries are left.

A preemption victim whose processes node agents execute is failed here only
``kill_margin_s`` after its grace period: the run dispatcher fails it first,
once every rank has exited (after the agents' own kill at the grace period),
so the preemptor's GPUs are handed over only when the victim's processes are
gone.  This is the fallback for agents that never report; emulated and
simulated runs have no margin.
"""

from __future__ import annotations

import msgspec

ACTIVE = ("admitted", "placed", "running")


class HeldRun(msgspec.Struct, frozen=True):
    """A job's current run while it holds quota."""

    job_id: str
    status: str  # admitted, placed or running
    admitted_at: float | None
    preempt_deadline: float | None = None  # from its preemption notice, if it got one
    started_at: float | None = None  # when the run started running (RunStarted)
    runtime_limit_s: float | None = None  # the spec's max_runtime_s; None: no limit
    kill_margin_s: float = 0.0  # stopped for preemption this long after its deadline (executing nodes)


class Stop(msgspec.Struct, frozen=True):
    job_id: str
    reason: str  # "preempted", "timeout" or "placement_timeout" (a RunFailed reason)


def overdue(runs: list[HeldRun], now: float, placement_timeout_s: float) -> list[Stop]:
    """Which runs to stop now, and why.  A run past both its grace period and
    its run-time limit is stopped for whichever came first (the preemption on a
    tie); either wins over the placement timeout."""
    stops = []
    for run in runs:
        if run.status not in ACTIVE:
            continue
        due: list[tuple[float, str]] = []
        if run.preempt_deadline is not None and now >= run.preempt_deadline + run.kill_margin_s:
            due.append((run.preempt_deadline + run.kill_margin_s, "preempted"))
        if run.status == "running" and run.started_at is not None and run.runtime_limit_s is not None:
            limit = run.started_at + run.runtime_limit_s
            if now >= limit:
                due.append((limit, "timeout"))
        if due:
            stops.append(Stop(run.job_id, min(due)[1]))
        elif run.status == "admitted" and run.admitted_at is not None and now >= run.admitted_at + placement_timeout_s:
            stops.append(Stop(run.job_id, "placement_timeout"))
    return stops
