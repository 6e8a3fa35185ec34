"""REST routes for finance: chargeback exports and the capacity report, plus
the time-window rules ``GET /v1/usage`` shares with them.

Both are for the finance and admin roles (:mod:`trainyard.auth.policy`);
any other verified caller gets 403.  ``tenant`` narrows a chargeback export
to one tenant's rows.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Query
from fastapi.responses import Response

from trainyard.auth import Action, Principal
from trainyard.bus import Bus
from trainyard.domain.job import ValidationError
from trainyard.ledger import Ledger, RateCardError, chargeback_rows, chargeback_summary, encode_rows, period_bounds
from trainyard.ledger.finance_config import read_cost_centres, read_rate_card
from trainyard.reports import (
    CapacityReport,
    capacity_from_nodes,
    capacity_report,
    parse_capacity,
    parse_instant,
    window_problem,
)
from trainyard.settings import Settings
from trainyard.store import Store, views
from trainyard_gateway.errors import error_response, json_response
from trainyard_gateway.jobs import InvalidRequest, check_tenant_name
from trainyard_gateway.security import allow

FORMATS = {"csv": "text/csv; charset=utf-8", "parquet": "application/vnd.apache.parquet"}
#: ``group_by`` names the usage endpoint accepts -> ledger grouping keys.
USAGE_GROUPS = {"tenant": "tenant", "queue": "queue", "gpu_type": "gpu_type", "job": "job_id", "job_id": "job_id"}
DEFAULT_USAGE_GROUPS = ("tenant", "gpu_type")


def window_bound(field: str, value: str | None, *, end_of_day: bool = False) -> float | None:
    """The query parameter ``field`` read by :func:`trainyard.reports.parse_instant`;
    :class:`InvalidRequest` naming it when it is not a time."""
    try:
        return parse_instant(value, end_of_day=end_of_day)
    except ValueError as err:
        raise InvalidRequest([ValidationError(field, str(err))]) from None


def usage_query(start: str | None, end: str | None, group_by: str | None) -> dict[str, Any]:
    """Keyword arguments for a usage source from the query string: only the
    ones the caller gave (``start``, ``end``, ``group_by``).  Raises
    :class:`InvalidRequest` naming the bad parameter."""
    query: dict[str, Any] = {}
    lo = window_bound("from", start)
    hi = window_bound("to", end, end_of_day=True)
    if lo is not None and hi is not None and hi <= lo:
        raise InvalidRequest([ValidationError("to", "must be after 'from'")])
    if lo is not None:
        query["start"] = lo
    if hi is not None:
        query["end"] = hi
    if group_by is not None:
        names = [g.strip() for g in group_by.split(",") if g.strip()]
        bad = [g for g in names if g not in USAGE_GROUPS]
        if bad or not names:
            choices = ", ".join(k for k in USAGE_GROUPS if k != "job_id")
            raise InvalidRequest([ValidationError("group_by", f"group by a comma-separated list of: {choices}")])
        query["group_by"] = tuple(dict.fromkeys(USAGE_GROUPS[g] for g in names))
    return query


def ledger_opener(settings: Settings) -> Callable[[], Ledger]:
    """The ledger at ``settings.ledger_url``, opened on first use."""
    ledgers: list[Ledger] = []

    def ledger() -> Ledger:
        if not ledgers:
            opened = Ledger(settings.ledger_url)
            opened.create_schema()  # idempotent; the gateway may start before accounting
            ledgers.append(opened)
        return ledgers[0]

    return ledger


def chargeback_export(
    ledger: Ledger, period: str, fmt: str, tenant: str | None, as_of: float | None
) -> tuple[bytes, dict[str, str]]:
    """One month's chargeback rows encoded as ``fmt``, and the headers that
    sum them up: the row count, the net billed total, the gross usage and the
    hardware-failure credit (blocking: run it in a thread)."""
    card = read_rate_card()
    rows = chargeback_rows(ledger, period, card, cost_centres=read_cost_centres(), now=as_of)
    if tenant is not None:
        rows = [row for row in rows if row["SubAccountId"] == tenant]
    summary = chargeback_summary(rows)
    headers = {
        "X-Trainyard-Rows": str(len(rows)),
        "X-Trainyard-Billed-Total": f"{summary.net} {card.currency}",
        "X-Trainyard-Gross-Total": f"{summary.gross} {card.currency}",
        "X-Trainyard-Credit-Total": f"{summary.credit} {card.currency}",
    }
    return encode_rows(rows, fmt), headers  # type: ignore[arg-type]


def chargeback_filename(period: str, fmt: str, tenant: str | None) -> str:
    return f"chargeback-{period}{'-' + tenant if tenant else ''}.{fmt}"


def build_capacity_report(
    ledger: Ledger, gpus: dict[str, int], lo: float, hi: float, now: float, bucket_s: float, horizon: int
) -> CapacityReport:
    """The capacity report over [lo, hi) from the ledger (blocking: run it in a thread)."""
    jobs = ledger.jobs(end=hi)
    runs = [r for r in ledger.runs() if (r.placed_at if r.placed_at is not None else r.started_at or hi) < hi]
    return capacity_report(runs, jobs, gpus, lo, hi, now, bucket_s=bucket_s, horizon_days=horizon)  # type: ignore[arg-type]


#: The latest ``as_of`` a report takes: the last second of the year 9999.
LATEST_AS_OF = 253_402_300_799.0


def as_of_problems(as_of: float | None) -> list[ValidationError]:
    """``as_of`` must be a Unix time a calendar can show: finite (not nan or inf), 0 to year 9999."""
    if as_of is None or (math.isfinite(as_of) and 0 <= as_of <= LATEST_AS_OF):
        return []
    return [ValidationError("as_of", f"{as_of!r} is not a Unix time; give seconds from 0 to {LATEST_AS_OF:.0f}")]


def build_router(bus: Bus, store: Store, settings: Settings) -> APIRouter:
    router = APIRouter(prefix="/v1", tags=["finance"])
    ledger = ledger_opener(settings)

    def export(period: str, fmt: str, tenant: str | None, as_of: float | None) -> tuple[bytes, dict[str, str]]:
        return chargeback_export(ledger(), period, fmt, tenant, as_of)

    @router.get(
        "/exports/chargeback",
        summary="Chargeback export of one month (finance and admin)",
        responses={
            200: {
                "description": "FOCUS-style rows as CSV or Parquet",
                "content": {m.split(";")[0]: {} for m in FORMATS.values()},
            },
            403: {"description": "The caller's role is neither finance nor admin"},
            422: {"description": "Bad period, format or tenant"},
            500: {"description": "The rate card cannot price the usage, or cannot be read"},
        },
    )
    async def export_chargeback(
        period: str = Query(..., description="Billing month, YYYY-MM"),
        format: str = Query("csv", description="csv or parquet"),
        as_of: float | None = Query(None, description="Meter open runs up to this Unix time (default: now)"),
        tenant: str | None = Query(None, description="Only this tenant's rows"),
        who: Principal = allow(Action.CHARGEBACK_EXPORT),
    ) -> Response:
        problems = check_tenant_name(tenant) + as_of_problems(as_of)
        if format not in FORMATS:
            problems.append(ValidationError("format", f"{format!r} is not supported; use csv or parquet"))
        try:
            period_bounds(period)
        except ValueError as err:
            problems.append(ValidationError("period", str(err)))
        if problems:
            raise InvalidRequest(problems)
        try:
            body, totals = await asyncio.to_thread(export, period, format, tenant, as_of)
        except RateCardError as err:
            return error_response(500, "configuration_error", f"the chargeback cannot be priced: {err}")
        name = chargeback_filename(period, format, tenant)
        headers = {"Content-Disposition": f'attachment; filename="{name}"', **totals}
        return Response(content=body, media_type=FORMATS[format], headers=headers)

    @router.get(
        "/reports/capacity",
        summary="Capacity-planning report over whole UTC days (finance or admin)",
        responses={
            200: {
                "description": "The report as JSON: allocation vs capacity per bucket and GPU type, queue waits, "
                "lost work, demand trend and forecast"
            },
            403: {"description": "The caller's role is neither finance nor admin"},
            422: {"description": "Bad window, capacity, bucket or horizon"},
        },
    )
    async def capacity_report_route(
        start: str = Query(..., alias="from", description="First day, YYYY-MM-DD (UTC)"),
        end: str = Query(..., alias="to", description="Last day, YYYY-MM-DD (UTC), included"),
        capacity: str | None = Query(
            None, description="GPUs per type, e.g. H100=128,A100=16x8 (default: the registered nodes)"
        ),
        bucket: str = Query("day", description="day or hour"),
        horizon: int = Query(14, ge=0, le=365, description="Days of demand forecast past the last complete day"),
        as_of: float | None = Query(None, description="Report as of this Unix time (default: now)"),
        who: Principal = allow(Action.CAPACITY_READ),
    ) -> Response:
        lo, hi = window_bound("from", start), window_bound("to", end, end_of_day=True)
        problems = as_of_problems(as_of)
        if lo is None or hi is None or lo % 86_400 or hi % 86_400 or hi <= lo:
            problems.append(ValidationError("to", "from and to must be dates (YYYY-MM-DD), to on or after from"))
        if bucket not in ("day", "hour"):
            problems.append(ValidationError("bucket", f"{bucket!r} is not day or hour"))
        bucket_s = 86_400.0 if bucket == "day" else 3_600.0
        if not problems and (too_long := window_problem(lo, hi, bucket_s)):
            problems.append(ValidationError("to", too_long))
        gpus: dict[str, int] = {}
        if capacity is not None:
            try:
                gpus = parse_capacity(capacity)
            except ValueError as err:
                problems.append(ValidationError("capacity", str(err)))
        if problems:
            raise InvalidRequest(problems)
        if not gpus:
            gpus = capacity_from_nodes((info.gpu_type, info.gpus) for info, _, _ in await views.node_views(store))
        now = time.time() if as_of is None else as_of

        def build() -> CapacityReport:
            return build_capacity_report(ledger(), gpus, lo, hi, now, bucket_s, horizon)

        return json_response(await asyncio.to_thread(build))

    return router
