"""Queue waits and pending demand, from when jobs were accepted and their
runs placed.

A job is *pending* from when it is accepted until its first run is placed,
and again from the end of a run until the next run is placed (a requeue
after preemption or a node failure).  Each placement ends one wait::

    queue wait = placed_at - accepted_at         (first run)
    queue wait = placed_at - previous ended_at   (a later run)

A job never placed waits until it is cancelled, or until ``now``.  A job
requeued after its last run ended is counted once its next run is placed.
Pure: plain values in, plain values out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgspec

from trainyard.ledger.records import LedgerJob, LedgerRun

PLACED = "placed"
CANCELLED = "cancelled"
WAITING = "waiting"


class PendingSpan(msgspec.Struct, frozen=True):
    job_id: str
    tenant: str
    gpus_by_type: dict[str, int]  # GPUs the job asks for
    since: float  # accepted (or previous run ended)
    until: float  # placed, cancelled, or ``now`` while still waiting
    ended_by: str  # "placed", "cancelled", or "waiting" (still pending at ``now``)

    @property
    def seconds(self) -> float:
        return max(0.0, self.until - self.since)


class WaitStats(msgspec.Struct, frozen=True):
    tenant: str
    placements: int  # waits that ended in a placement inside the window
    p50_s: float | None  # nearest-rank percentiles of those waits, seconds
    p90_s: float | None
    p99_s: float | None
    max_s: float | None
    mean_s: float | None
    still_waiting: int  # jobs accepted and not placed at the end of the window


def pending_spans(jobs: Iterable[LedgerJob], runs: Iterable[LedgerRun], now: float) -> list[PendingSpan]:
    """Every pending interval of every job, ordered by job and time."""
    by_job: dict[str, list[LedgerRun]] = {}
    for run in runs:
        if run.placed_at is not None:
            by_job.setdefault(run.job_id, []).append(run)
    spans: list[PendingSpan] = []
    for job in jobs:
        if job.accepted_at is None:
            continue
        placed_runs = sorted(by_job.get(job.job_id, ()), key=lambda r: (r.placed_at, r.run_id))
        since: float | None = job.accepted_at
        for run in placed_runs:
            if since is None:
                break
            assert run.placed_at is not None
            until = max(since, run.placed_at)
            spans.append(PendingSpan(job.job_id, job.tenant, job.gpus_by_type, since, until, PLACED))
            since = run.ended_at
        if not placed_runs:
            cancelled = job.cancelled_at is not None and job.cancelled_at <= now
            until = job.cancelled_at if cancelled else now
            if until > job.accepted_at:  # type: ignore[operator]
                ended_by = CANCELLED if cancelled else WAITING
                spans.append(PendingSpan(job.job_id, job.tenant, job.gpus_by_type, job.accepted_at, until, ended_by))
    return spans


def percentile(sorted_values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile: the smallest value with at least ``p``
    percent of the values at or below it.  None for no values."""
    if not sorted_values:
        return None
    rank = max(1, -(-len(sorted_values) * p // 100))  # ceil(n * p / 100), at least 1
    return sorted_values[int(rank) - 1]


def wait_stats(spans: Iterable[PendingSpan], start: float, end: float) -> list[WaitStats]:
    """Queue-wait percentiles per tenant, over placements inside [start, end),
    plus the jobs still waiting at ``end``."""
    waits: dict[str, list[float]] = {}
    waiting: dict[str, int] = {}
    for span in spans:
        if span.ended_by == PLACED and start <= span.until < end:
            waits.setdefault(span.tenant, []).append(span.seconds)
        elif span.since < end and (span.ended_by == WAITING or span.until >= end):
            waiting[span.tenant] = waiting.get(span.tenant, 0) + 1
    out = []
    for tenant in sorted(set(waits) | set(waiting)):
        values = sorted(waits.get(tenant, []))
        out.append(
            WaitStats(
                tenant=tenant,
                placements=len(values),
                p50_s=percentile(values, 50),
                p90_s=percentile(values, 90),
                p99_s=percentile(values, 99),
                max_s=values[-1] if values else None,
                mean_s=sum(values) / len(values) if values else None,
                still_waiting=waiting.get(tenant, 0),
            )
        )
    return out
