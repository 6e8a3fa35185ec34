"""Console pages for finance: usage by tenant (or queue, or GPU type) over
time as stacked bars per day or hour, the chargeback download for a month
(CSV or Parquet), and the capacity report, its days dated and starting no
earlier than the cluster did.  They read the accounting ledger the gateway
reads for ``/v1/usage`` and the finance API, with the same role checks."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import msgspec
from fastapi import APIRouter, Request
from fastapi.responses import Response

from trainyard.auth import Action, PermissionDenied, tenant_filter
from trainyard.bus import Bus
from trainyard.ledger import Ledger, RateCardError, period_bounds
from trainyard.ledger.records import LedgerJob, LedgerRun
from trainyard.reports import CapacityReport, CapacityRow, capacity_from_nodes, capacity_report, window_problem
from trainyard.store import Store, views
from trainyard.store.caught_up import CaughtUpReads
from trainyard_gateway.console.bars import stacked_bars
from trainyard_gateway.console.palette import Palette, tenancy_tenants
from trainyard_gateway.console.rebuilding import answers_rebuilding
from trainyard_gateway.console.render import page
from trainyard_gateway.console.session import principal, refusal
from trainyard_gateway.finance_api import FORMATS, chargeback_export, chargeback_filename, window_bound
from trainyard_gateway.jobs import InvalidRequest, check_tenant_name

GROUPS = ("tenant", "queue", "gpu_type")
DAY_S = 86_400.0


def month_start(today: dt.date) -> dt.date:
    return today.replace(day=1)


def usage_series(
    runs: list[LedgerRun], group: str, lo: float, hi: float, bucket_s: float, now: float
) -> dict[str, Any]:
    """GPU-hours per bucket of [lo, hi) and per group value (what the chart draws)."""
    n = max(1, int((hi - lo + bucket_s - 1) // bucket_s))
    series: dict[str, list[float]] = {}
    for run in runs:
        if run.started_at is None:
            continue
        a = max(run.started_at, lo)
        b = min(run.ended_at if run.ended_at is not None else now, hi)
        if b <= a:
            continue
        key = str(getattr(run, group) or "-")
        values = series.setdefault(key, [0.0] * n)
        first, last = int((a - lo) // bucket_s), min(n - 1, int((b - lo) // bucket_s))
        for i in range(first, last + 1):
            start, end = lo + i * bucket_s, lo + (i + 1) * bucket_s
            values[i] += run.gpus * max(0.0, min(b, end) - max(a, start)) / 3600.0
    ordered = dict(sorted(series.items()))
    return {
        "x": [lo + i * bucket_s for i in range(n)],
        "series": {k: [round(v, 4) for v in vs] for k, vs in ordered.items()},
        "totals": {k: round(sum(vs), 3) for k, vs in ordered.items()},
    }


def day_of(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%d")


def cluster_start(
    registered: Iterable[float | None], jobs: Sequence[LedgerJob], runs: Sequence[LedgerRun]
) -> float | None:
    """When the cluster began: the earliest node registration or ledger record
    (a job accepted, a run placed or started); None when there is neither."""
    times = [t for t in registered if t is not None]
    times += [j.accepted_at for j in jobs if j.accepted_at is not None]
    times += [t for r in runs for t in (r.placed_at, r.started_at) if t is not None]
    return min(times, default=None)


def report_start(lo: float, hi: float, began: float | None) -> float:
    """Where the report's days begin: the window's start, or the day the
    cluster began when that is later (no capacity is counted before it);
    ``hi`` or later when the cluster began after the window."""
    if began is None:
        return lo
    return max(lo, began // DAY_S * DAY_S)


def from_start(rows: list[CapacityRow], began: float | None) -> list[CapacityRow]:
    """``rows`` with the capacity of the day the cluster began counted from
    when it began, not from midnight (and its utilisation against that)."""
    if began is None:
        return rows
    out = []
    for row in rows:
        if row.bucket_start < began < row.bucket_end:
            hours = row.capacity_gpus * (row.bucket_end - began) / 3600.0
            used = row.allocated_gpu_hours / hours if hours > 0 else None
            row = msgspec.structs.replace(row, capacity_gpu_hours=round(hours, 4), utilisation=used)
        out.append(row)
    return out


def console_capacity(
    ledger: Ledger, gpus: dict[str, int], registered: list[float | None], lo: float, hi: float, now: float
) -> tuple[CapacityReport | None, float | None, float]:
    """The capacity report over the days of [lo, hi) from the day the cluster
    began (None when it began after ``hi``; that day's capacity counted from
    when it began), when it began, and the first day reported (blocking: run
    it in a thread)."""
    jobs = ledger.jobs(end=hi)
    runs = [r for r in ledger.runs() if (r.placed_at if r.placed_at is not None else r.started_at or hi) < hi]
    began = cluster_start(registered, jobs, runs)
    start = report_start(lo, hi, began)
    if start >= hi:
        return None, began, start
    report = capacity_report(runs, jobs, gpus, start, hi, now, bucket_s=DAY_S, horizon_days=14)
    return msgspec.structs.replace(report, daily=from_start(report.daily, began)), began, start


def build_router(
    bus: Bus, store: Store, ledger: Callable[[], Ledger] | None, nodes_caught_up: CaughtUpReads
) -> APIRouter:
    """``nodes_caught_up``: how the capacity page reads the fleet (the NODES projection)."""
    router = APIRouter(include_in_schema=False)

    def no_ledger(request: Request, who: Any) -> Response:
        return page(request, "error.html", who, status_code=501, message="this gateway has no accounting ledger")

    @router.get("/usage")
    async def usage_page(
        request: Request, start: str = "", end: str = "", group: str = "tenant", bucket: str = ""
    ) -> Response:
        who = principal(request)
        today = dt.datetime.now(dt.UTC).date()
        start, end = start or month_start(today).isoformat(), end or today.isoformat()
        group = group if group in GROUPS else "tenant"
        try:
            scope = tenant_filter(who, Action.USAGE_READ, None)
            lo, hi = window_bound("from", start), window_bound("to", end, end_of_day=True)
        except PermissionDenied as err:
            return page(request, "error.html", who, status_code=403, message=str(err))
        except InvalidRequest as err:
            return page(request, "error.html", who, status_code=422, message=str(err))
        if lo is None or hi is None or hi <= lo:
            return page(request, "error.html", who, status_code=422, message="'to' must be on or after 'from'")
        if ledger is None:
            return no_ledger(request, who)
        bucket = bucket if bucket in ("hour", "day") else ("hour" if hi - lo <= 3 * DAY_S else "day")
        bucket_s = 3600.0 if bucket == "hour" else DAY_S
        if (hi - lo) / bucket_s > 2000:
            return page(request, "error.html", who, status_code=422, message="choose a shorter window or daily buckets")
        now = time.time()
        opened = ledger
        runs = await asyncio.to_thread(lambda: opened().runs(tenant=scope, start=lo, end=hi))
        data = usage_series(runs, group, lo, hi, bucket_s, now)
        palette = Palette(await tenancy_tenants(bus) if group == "tenant" else (), data["series"])
        return page(
            request,
            "usage.html",
            who,
            data=data,
            chart=stacked_bars(data["x"], data["series"], palette, bucket_s),
            palette=palette,
            start=start,
            end=end,
            group=group,
            groups=GROUPS,
            bucket=bucket,
            scope=scope,
            month=today.strftime("%Y-%m"),
            formats=list(FORMATS),
        )

    @router.get("/finance/chargeback")
    async def chargeback(request: Request, period: str = "", format: str = "csv", tenant: str = "") -> Response:
        who = principal(request)
        if (refused := refusal(request, who, Action.CHARGEBACK_EXPORT)) is not None:
            return refused
        period = period or dt.datetime.now(dt.UTC).strftime("%Y-%m")
        problems = [e.message for e in check_tenant_name(tenant or None)]
        if format not in FORMATS:
            problems.append(f"{format!r} is not a format; use csv or parquet")
        try:
            period_bounds(period)
        except ValueError as err:
            problems.append(str(err))
        if problems:
            return page(request, "error.html", who, status_code=422, message="; ".join(problems))
        if ledger is None:
            return no_ledger(request, who)
        opened = ledger
        try:
            body, totals = await asyncio.to_thread(
                lambda: chargeback_export(opened(), period, format, tenant or None, None)
            )
        except RateCardError as err:
            return page(request, "error.html", who, status_code=500, message=f"the chargeback cannot be priced: {err}")
        name = chargeback_filename(period, format, tenant or None)
        headers = {"Content-Disposition": f'attachment; filename="{name}"', **totals}
        return Response(content=body, media_type=FORMATS[format], headers=headers)

    @router.get("/finance/capacity")
    @answers_rebuilding
    async def capacity(request: Request, start: str = "", end: str = "") -> Response:
        who = principal(request)
        if (refused := refusal(request, who, Action.CAPACITY_READ)) is not None:
            return refused
        today = dt.datetime.now(dt.UTC).date()
        start, end = start or month_start(today).isoformat(), end or today.isoformat()
        try:
            lo, hi = window_bound("from", start), window_bound("to", end, end_of_day=True)
        except InvalidRequest as err:
            return page(request, "error.html", who, status_code=422, message=str(err))
        if lo is None or hi is None or lo % DAY_S or hi % DAY_S or hi <= lo:
            return page(
                request, "error.html", who, status_code=422, message="from and to must be dates, to on or after from"
            )
        if too_long := window_problem(lo, hi, DAY_S):
            return page(request, "error.html", who, status_code=422, message=too_long)
        if ledger is None:
            return no_ledger(request, who)
        fleet = await nodes_caught_up.read(lambda: views.list_nodes(store))  # never an empty fleet while rebuilt
        gpus = capacity_from_nodes((n.info.gpu_type, n.info.gpus) for n in fleet if n.info is not None)
        registered = [n.registered_at for n in fleet]
        opened = ledger
        report, began, first = await asyncio.to_thread(
            lambda: console_capacity(opened(), gpus, registered, lo, hi, time.time())
        )
        totals: dict[str, dict[str, float]] = {}
        for row in report.daily if report is not None else []:
            t = totals.setdefault(row.gpu_type, {"capacity": 0.0, "allocated": 0.0, "pending": 0.0})
            t["capacity"] += row.capacity_gpu_hours
            t["allocated"] += row.allocated_gpu_hours
            t["pending"] += row.pending_gpu_hours
        return page(
            request,
            "capacity.html",
            who,
            report=report,
            totals=totals,
            start=start,
            end=end,
            began=day_of(began) if began is not None else None,
            first=day_of(first) if first > lo else None,
            day_of=day_of,
        )

    return router
