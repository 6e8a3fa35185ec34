"""Capacity planning: allocation against capacity per GPU type over time,
pending demand, queue waits, lost work and a demand trend.

Every measure is in GPU-hours per time bucket (a day by default):

- ``capacity``  -- GPUs installed x bucket hours;
- ``allocated`` -- GPUs held by runs, from placement to the end of the run
  (an open run up to ``now``): what the fleet gave;
- ``pending``   -- GPUs asked for by jobs waiting in a queue (see
  :mod:`trainyard.reports.queue_wait`): what the fleet did not give;
- ``demand``    -- allocated + pending: what tenants asked for.

The forecast fits a least-squares straight line to *daily* demand over the
complete days of the window (days ending at or before ``now``) and extends
it ``horizon_days`` past the last of them (:mod:`trainyard.reports.forecast`).

Pure: ledger records and numbers in, a :class:`CapacityReport` out.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence

import msgspec

from trainyard.core.accounting.metering import overlap
from trainyard.ledger.records import LedgerJob, LedgerRun
from trainyard.reports.forecast import extend, first_day_over, fit_trend
from trainyard.reports.queue_wait import PendingSpan, WaitStats, pending_spans, wait_stats

DAY = 86_400.0
MAX_BUCKETS = 20_000  # per GPU type in one report: 54 years of days, 833 days of hours
MAX_HORIZON_DAYS = 365


def window_problem(start: float, end: float, bucket_s: float, horizon_days: int = 0) -> str | None:
    """What is wrong with a report window too long for its buckets, or a forecast too far out; None if fine.
    The report is built in memory and returned whole, so its size is bounded before it is built."""
    buckets = math.ceil((end - start) / bucket_s)
    if buckets > MAX_BUCKETS:
        unit = "day" if bucket_s == DAY else "hour"
        other = "; or use day buckets" if unit == "hour" else ""
        return f"the window holds {buckets:,} {unit} buckets; a report holds at most {MAX_BUCKETS:,}: shorten it{other}"
    if not 0 <= horizon_days <= MAX_HORIZON_DAYS:
        return f"the forecast horizon must be 0 to {MAX_HORIZON_DAYS} days, not {horizon_days}"
    return None


HOUR = 3_600.0
FORECAST_METHOD = (
    "ordinary least-squares linear trend over daily demand (allocated + pending GPU-hours) "
    "of the complete days in the window, extended forward, floored at zero"
)


class CapacityRow(msgspec.Struct, frozen=True):
    bucket_start: float  # Unix seconds, UTC
    bucket_end: float
    gpu_type: str
    capacity_gpus: int
    capacity_gpu_hours: float
    allocated_gpu_hours: float
    pending_gpu_hours: float
    demand_gpu_hours: float
    utilisation: float | None  # allocated / capacity; None with no capacity


class LostWorkRow(msgspec.Struct, frozen=True):
    tenant: str
    gpu_type: str
    runs_ended: int  # runs that ended inside the window
    runs_lost_work: int  # of those, runs ended by preemption or an infrastructure failure with work lost
    gpu_hours: float  # GPU-hours of the runs that ended
    lost_gpu_hours: float  # GPU-hours since their last checkpoint: work to redo
    lost_share: float | None  # lost / gpu_hours


class TrendRow(msgspec.Struct, frozen=True):
    gpu_type: str
    days: int  # days of history fitted
    slope_gpu_hours_per_day: float
    intercept_gpu_hours: float
    r2: float
    capacity_gpu_hours_per_day: float
    first_day_over_capacity: float | None  # start of the first forecast day above capacity


class ForecastRow(msgspec.Struct, frozen=True):
    day_start: float
    gpu_type: str
    demand_gpu_hours: float  # forecast
    capacity_gpu_hours: float


class CapacityReport(msgspec.Struct, frozen=True):
    start: float
    end: float
    now: float
    bucket_s: float
    capacity: dict[str, int]  # GPU type -> GPUs installed
    timeline: list[CapacityRow]  # per bucket and GPU type
    daily: list[CapacityRow]  # per day and GPU type (the forecast's history)
    waits: list[WaitStats]
    lost: list[LostWorkRow]
    trends: list[TrendRow]
    forecast: list[ForecastRow]
    forecast_method: str = FORECAST_METHOD


_CAPACITY_ITEM = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*=\s*(\d+)\s*(?:x\s*(\d+)\s*)?$")


def parse_capacity(text: str) -> dict[str, int]:
    """``"H100=128,A100=16x8"`` -> GPUs per type: a plain number is GPUs,
    ``NxG`` is N nodes of G GPUs.  Raises ``ValueError`` saying what to fix."""
    out: dict[str, int] = {}
    for item in filter(str.strip, text.split(",")):
        match = _CAPACITY_ITEM.match(item)
        if not match:
            raise ValueError(f"capacity {item.strip()!r} must look like H100=128 (GPUs) or H100=16x8 (nodes x GPUs)")
        gpu_type, count, per_node = match.groups()
        out[gpu_type] = out.get(gpu_type, 0) + int(count) * (int(per_node) if per_node else 1)
    if not out:
        raise ValueError("capacity is empty; give GPUs per type, e.g. H100=128")
    return dict(sorted(out.items()))


def capacity_from_nodes(nodes: Iterable[tuple[str, int]]) -> dict[str, int]:
    """GPUs per type from ``(gpu_type, gpus)`` of each registered node."""
    out: dict[str, int] = {}
    for gpu_type, gpus in nodes:
        out[gpu_type] = out.get(gpu_type, 0) + gpus
    return dict(sorted(out.items()))


def _spread(
    into: dict[tuple[int, str], float],
    lo: float,
    hi: float,
    by_type: Mapping[str, int],
    start: float,
    bucket_s: float,
    n: int,
) -> None:
    """Add GPU-hours of [lo, hi) holding ``by_type`` into the buckets it overlaps."""
    if hi <= lo:
        return
    first = max(0, int((lo - start) // bucket_s))
    last = min(n - 1, int(math.ceil((hi - start) / bucket_s)) - 1)
    for i in range(first, last + 1):
        seconds = overlap(lo, hi, start + i * bucket_s, start + (i + 1) * bucket_s)
        if seconds > 0:
            for gpu_type, gpus in by_type.items():
                into[(i, gpu_type)] = into.get((i, gpu_type), 0.0) + gpus * seconds / HOUR


def timeline(
    runs: Sequence[LedgerRun],
    spans: Sequence[PendingSpan],
    capacity: Mapping[str, int],
    start: float,
    end: float,
    now: float,
    bucket_s: float,
) -> list[CapacityRow]:
    """Capacity, allocation, pending and demand per bucket of [start, end) and GPU type."""
    if bucket_s <= 0 or end <= start:
        raise ValueError("the report needs a positive bucket and a window that ends after it starts")
    n = int(math.ceil((end - start) / bucket_s))
    allocated: dict[tuple[int, str], float] = {}
    pending: dict[tuple[int, str], float] = {}
    types = set(capacity)
    for run in runs:
        held_from = run.placed_at if run.placed_at is not None else run.started_at
        if held_from is None:
            continue
        held_to = run.ended_at if run.ended_at is not None else now
        _spread(allocated, held_from, min(held_to, end), run.gpus_by_type, start, bucket_s, n)
        types.update(run.gpus_by_type)
    for span in spans:
        _spread(pending, span.since, min(span.until, end), span.gpus_by_type, start, bucket_s, n)
        types.update(span.gpus_by_type)
    rows = []
    for i in range(n):
        lo, hi = start + i * bucket_s, min(end, start + (i + 1) * bucket_s)
        for gpu_type in sorted(types):
            gpus = capacity.get(gpu_type, 0)
            cap = gpus * (hi - lo) / HOUR
            alloc = allocated.get((i, gpu_type), 0.0)
            pend = pending.get((i, gpu_type), 0.0)
            rows.append(
                CapacityRow(lo, hi, gpu_type, gpus, cap, alloc, pend, alloc + pend, alloc / cap if cap else None)
            )
    return rows


def lost_work(runs: Iterable[LedgerRun], start: float, end: float) -> list[LostWorkRow]:
    """Work lost to preemption and failures, per tenant and GPU type, for
    runs that ended inside [start, end)."""
    acc: dict[tuple[str, str], list[float]] = {}
    for run in runs:
        if run.ended_at is None or not start <= run.ended_at < end or not run.gpus:
            continue
        for gpu_type, gpus in run.gpus_by_type.items():
            share = gpus / run.gpus
            row = acc.setdefault((run.tenant, gpu_type), [0, 0, 0.0, 0.0])
            row[0] += 1
            row[1] += 1 if (run.lost_seconds or 0.0) > 0 else 0
            row[2] += (run.gpu_seconds or 0.0) * share / HOUR
            row[3] += (run.lost_seconds or 0.0) * share / HOUR
    return [
        LostWorkRow(tenant, gpu_type, int(e), int(lo), h, lh, lh / h if h else None)
        for (tenant, gpu_type), (e, lo, h, lh) in sorted(acc.items())
    ]


def forecast_demand(
    daily: Sequence[CapacityRow], now: float, horizon_days: int
) -> tuple[list[TrendRow], list[ForecastRow]]:
    """Fit a trend per GPU type to the complete days of ``daily`` and extend it."""
    trends: list[TrendRow] = []
    forecast: list[ForecastRow] = []
    by_type: dict[str, list[CapacityRow]] = {}
    for row in daily:
        if row.bucket_end <= now and row.bucket_end - row.bucket_start == DAY:
            by_type.setdefault(row.gpu_type, []).append(row)
    for gpu_type, rows in sorted(by_type.items()):
        rows.sort(key=lambda r: r.bucket_start)
        trend = fit_trend([r.demand_gpu_hours for r in rows])
        if trend is None:  # pragma: no cover - rows is never empty here
            continue
        cap_per_day = rows[-1].capacity_gpus * 24.0
        values = extend(trend, horizon_days)
        first_start = rows[0].bucket_start
        over = first_day_over(values, cap_per_day) if cap_per_day else None
        trends.append(
            TrendRow(
                gpu_type,
                trend.days,
                trend.slope,
                trend.intercept,
                trend.r2,
                cap_per_day,
                first_start + (trend.days + over) * DAY if over is not None else None,
            )
        )
        for i, value in enumerate(values):
            forecast.append(ForecastRow(first_start + (trend.days + i) * DAY, gpu_type, value, cap_per_day))
    return trends, forecast


def capacity_report(
    runs: Sequence[LedgerRun],
    jobs: Sequence[LedgerJob],
    capacity: Mapping[str, int],
    start: float,
    end: float,
    now: float,
    *,
    bucket_s: float = DAY,
    horizon_days: int = 14,
) -> CapacityReport:
    """The whole capacity-planning report for [start, end), as of ``now``.

    1. pending intervals of every job (queue waits);
    2. capacity, allocation, pending and demand per bucket and GPU type;
    3. the same per day, for the forecast;
    4. queue-wait percentiles per tenant;
    5. lost work per tenant and GPU type;
    6. the demand trend and forecast per GPU type.
    """
    problem = window_problem(start, end, bucket_s, horizon_days)
    if problem is not None:
        raise ValueError(problem)
    spans = pending_spans(jobs, runs, now)
    rows = timeline(runs, spans, capacity, start, end, now, bucket_s)
    daily = rows if bucket_s == DAY else timeline(runs, spans, capacity, start, end, now, DAY)
    trends, forecast = forecast_demand(daily, now, horizon_days)
    return CapacityReport(
        start=start,
        end=end,
        now=now,
        bucket_s=bucket_s,
        capacity=dict(sorted(capacity.items())),
        timeline=rows,
        daily=daily,
        waits=wait_stats(spans, start, end),
        lost=lost_work(runs, start, end),
        trends=trends,
        forecast=forecast,
    )
