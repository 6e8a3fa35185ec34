"""Console pages for finance: usage by tenant (or queue, or GPU type) over
time as a chart, the chargeback download for a month (CSV or Parquet), and
the capacity report.  They read the accounting ledger the gateway reads for
``/v1/usage`` and the finance API, with the same role checks."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from trainyard.auth import Action, PermissionDenied, tenant_filter
from trainyard.ledger import Ledger, RateCardError, period_bounds
from trainyard.ledger.records import LedgerRun
from trainyard.reports import capacity_from_nodes, window_problem
from trainyard.store import Store, views
from trainyard.store.caught_up import CaughtUpReads
from trainyard_gateway.console.rebuilding import answers_rebuilding
from trainyard_gateway.console.render import page, tenant_colour
from trainyard_gateway.console.session import principal, refusal
from trainyard_gateway.finance_api import (
    FORMATS,
    build_capacity_report,
    chargeback_export,
    chargeback_filename,
    window_bound,
)
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
        "colours": {k: tenant_colour(k) for k in ordered},
    }


def build_router(store: Store, ledger: Callable[[], Ledger] | None, nodes_caught_up: CaughtUpReads) -> APIRouter:
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
        return page(
            request,
            "usage.html",
            who,
            data=data,
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
        fleet = await nodes_caught_up.read(lambda: views.node_views(store))  # never an empty fleet while rebuilt
        gpus = capacity_from_nodes((info.gpu_type, info.gpus) for info, _, _ in fleet)
        opened = ledger
        report = await asyncio.to_thread(lambda: build_capacity_report(opened(), gpus, lo, hi, time.time(), DAY_S, 14))
        totals: dict[str, dict[str, float]] = {}
        for row in report.daily:
            t = totals.setdefault(row.gpu_type, {"capacity": 0.0, "allocated": 0.0, "pending": 0.0})
            t["capacity"] += row.capacity_gpu_hours
            t["allocated"] += row.allocated_gpu_hours
            t["pending"] += row.pending_gpu_hours
        return page(request, "capacity.html", who, report=report, totals=totals, start=start, end=end)

    return router
