"""Chargeback exports: the ledger priced with a rate card, in FOCUS-style
columns, as CSV or Parquet.

One row per *run slice*: the part of a run inside the billing period, under
one rate card version, for one GPU type.  Costs are exact
:class:`~decimal.Decimal` amounts rounded to the cent per tenant with the
largest-remainder method, so a tenant's rows add up exactly to its rounded
total.  See docs/accounting.md for every column.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import re
import time
from collections.abc import Mapping
from decimal import ROUND_HALF_UP, Decimal, localcontext
from typing import Any, Literal

import msgspec

from trainyard.core.accounting.pricing import (
    RateCard,
    RateCardError,
    RateCardVersion,
    allocate_cents,
    load_rate_card,
    round_total,
)
from trainyard.ledger.ledger import Ledger
from trainyard.ledger.records import LedgerRun

__all__ = [
    "COLUMNS",
    "RateCard",
    "RateCardError",
    "RateCardVersion",
    "chargeback",
    "chargeback_rows",
    "chargeback_totals",
    "encode_rows",
    "load_rate_card",
    "period_bounds",
]

SERVICE_NAME = "Trainyard GPU"
RESOURCE_TYPE = "GPU training run"
GPU_HOUR = "GPU-Hour"
UNASSIGNED = "unassigned"  # cost centre of a tenant with none configured
QUANTITY = Decimal("0.000000001")  # GPU-hours are exported to 9 decimal places
UNIT_PRICE = Decimal("0.0000000001")  # unit prices to 10 decimal places

COLUMNS = (
    "BillingPeriodStart",
    "BillingPeriodEnd",
    "ChargePeriodStart",
    "ChargePeriodEnd",
    "BillingCurrency",
    "ChargeCategory",
    "ChargeDescription",
    "ServiceName",
    "ResourceId",
    "ResourceName",
    "ResourceType",
    "SkuId",
    "SkuPriceId",
    "ListUnitPrice",
    "PricingQuantity",
    "PricingUnit",
    "ConsumedQuantity",
    "ConsumedUnit",
    "ListCost",
    "BilledCost",
    "EffectiveCost",
    "SubAccountId",
    "SubAccountName",
    "x_CostCentre",
    "Tags",
)
_TIME_COLUMNS = ("BillingPeriodStart", "BillingPeriodEnd", "ChargePeriodStart", "ChargePeriodEnd")
_COST_COLUMNS = ("ListCost", "BilledCost", "EffectiveCost")
_QUANTITY_COLUMNS = ("PricingQuantity", "ConsumedQuantity")
_PERIOD = re.compile(r"^(\d{4})-(\d{2})$")


def period_bounds(period: str) -> tuple[float, float]:
    """[start, end) of a calendar month ``"YYYY-MM"`` in UTC, as Unix seconds."""
    match = _PERIOD.match(period)
    if not match or not 1 <= int(match.group(2)) <= 12:
        raise ValueError(f"billing period {period!r} must be a month written YYYY-MM, e.g. '2026-11'")
    year, month = int(match.group(1)), int(match.group(2))
    if not (1, 1) <= (year, month) <= (9999, 11):
        raise ValueError(f"billing period {period!r} is out of range: use a month from 0001-01 to 9999-11")
    start = dt.datetime(year, month, 1, tzinfo=dt.UTC)
    end = dt.datetime(year + (month == 12), month % 12 + 1, 1, tzinfo=dt.UTC)
    return start.timestamp(), end.timestamp()


def _utc(at: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(at, dt.UTC)


def _iso(at: dt.datetime) -> str:
    spec = "seconds" if at.microsecond == 0 else "milliseconds"
    return at.isoformat(timespec=spec).replace("+00:00", "Z")


def _exact(at: float) -> Decimal:
    # repr() is the shortest decimal that reads back as the same float, so a
    # time written to the millisecond stays exact.
    return Decimal(repr(at))


def chargeback_rows(
    ledger: Ledger,
    period: str,
    rate_card: RateCard,
    *,
    cost_centres: Mapping[str, str] | None = None,
    now: float | None = None,
) -> list[dict[str, Any]]:
    """The export's rows as dicts (times as aware datetimes, money as Decimal).

    Runs still open are charged up to ``now`` (the current time when not
    given); pass ``now`` to make an export reproducible.  Raises
    :class:`RateCardError` for usage the rate card does not price.
    """
    period_start, period_end = period_bounds(period)
    now = time.time() if now is None else now
    cost_centres = cost_centres or {}
    billing_start, billing_end = _utc(period_start), _utc(period_end)
    slices: list[tuple[tuple[Any, ...], dict[str, Any], Decimal]] = []
    with localcontext() as ctx:
        ctx.prec = 60
        for run in ledger.runs(start=period_start, end=period_end):
            until = run.ended_at if run.ended_at is not None else now
            lo, hi = max(run.started_at, period_start), min(until, period_end)  # type: ignore[type-var]
            for slice_lo, slice_hi, version in rate_card.slices(lo, hi):
                seconds = _exact(slice_hi) - _exact(slice_lo)
                for gpu_type, gpus in sorted(run.gpus_by_type.items()):
                    row = _row(run, gpu_type, gpus, seconds, version, cost_centres)
                    row.update(
                        BillingPeriodStart=billing_start,
                        BillingPeriodEnd=billing_end,
                        ChargePeriodStart=_utc(slice_lo),
                        ChargePeriodEnd=_utc(slice_hi),
                        BillingCurrency=rate_card.currency,
                    )
                    # Exact cost times 3600: kept whole so tenant totals round once.
                    numerator = gpus * seconds * row["ListUnitPrice"]
                    key = (run.tenant, slice_lo, run.run_id, gpu_type)
                    slices.append((key, row, numerator))
        slices.sort(key=lambda s: s[0])
        by_tenant: dict[str, list[int]] = {}
        for i, (key, _, _) in enumerate(slices):
            by_tenant.setdefault(key[0], []).append(i)
        for indexes in by_tenant.values():
            numerators = [slices[i][2] for i in indexes]
            exact = [n / 3600 for n in numerators]
            cents = allocate_cents(exact, total=round_total(sum(numerators, Decimal(0)) / 3600))
            for i, cost in zip(indexes, cents, strict=True):
                row = slices[i][1]
                row.update(ListCost=cost, BilledCost=cost, EffectiveCost=cost)
    return [{column: row[column] for column in COLUMNS} for _, row, _ in slices]


def _row(
    run: LedgerRun,
    gpu_type: str,
    gpus: int,
    seconds: Decimal,
    version: RateCardVersion,
    cost_centres: Mapping[str, str],
) -> dict[str, Any]:
    price = version.price(gpu_type)
    hours = (gpus * seconds / 3600).quantize(QUANTITY, rounding=ROUND_HALF_UP)
    cost_centre = cost_centres.get(run.tenant, UNASSIGNED)
    tags = {
        "tenant": run.tenant,
        "team": run.labels.get("team"),
        "queue": run.queue,
        "job": run.job_id,
        "job_name": run.name,
        "cost_centre": cost_centre,
        "outcome": run.outcome or "running",
    }
    return {
        "ChargeCategory": "Usage",
        "ChargeDescription": f"{gpus} x {gpu_type} GPU for run {run.run_id} of job {run.job_id}",
        "ServiceName": SERVICE_NAME,
        "ResourceId": run.run_id,
        "ResourceName": run.name or run.job_id,
        "ResourceType": RESOURCE_TYPE,
        "SkuId": gpu_type,
        "SkuPriceId": version.version,
        "ListUnitPrice": price.quantize(UNIT_PRICE, rounding=ROUND_HALF_UP),
        "PricingQuantity": hours,
        "PricingUnit": GPU_HOUR,
        "ConsumedQuantity": hours,
        "ConsumedUnit": GPU_HOUR,
        "SubAccountId": run.tenant,
        "SubAccountName": run.tenant,
        "x_CostCentre": cost_centre,
        "Tags": msgspec.json.encode(tags, order="sorted").decode(),
    }


def chargeback_totals(rows: list[dict[str, Any]]) -> dict[str, Decimal]:
    """BilledCost per tenant (SubAccountName) of export rows."""
    totals: dict[str, Decimal] = {}
    for row in rows:
        totals[row["SubAccountName"]] = totals.get(row["SubAccountName"], Decimal(0)) + row["BilledCost"]
    return totals


def chargeback(
    ledger: Ledger,
    period: str,
    rate_card: RateCard,
    fmt: Literal["csv", "parquet"] = "csv",
    *,
    cost_centres: Mapping[str, str] | None = None,
    now: float | None = None,
) -> bytes:
    """The chargeback export of one month (``"YYYY-MM"``) as CSV or Parquet bytes."""
    if fmt not in ("csv", "parquet"):
        raise ValueError(f"export format {fmt!r} is not supported; use 'csv' or 'parquet'")
    rows = chargeback_rows(ledger, period, rate_card, cost_centres=cost_centres, now=now)
    return encode_rows(rows, fmt)


def encode_rows(rows: list[dict[str, Any]], fmt: Literal["csv", "parquet"] = "csv") -> bytes:
    """Export rows (from :func:`chargeback_rows`, possibly filtered) as CSV or Parquet bytes."""
    if fmt not in ("csv", "parquet"):
        raise ValueError(f"export format {fmt!r} is not supported; use 'csv' or 'parquet'")
    return _csv(rows) if fmt == "csv" else _parquet(rows)


def _csv(rows: list[dict[str, Any]]) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for row in rows:
        writer.writerow([_iso(row[c]) if c in _TIME_COLUMNS else str(row[c]) for c in COLUMNS])
    return out.getvalue().encode()


def _parquet(rows: list[dict[str, Any]]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    types: dict[str, Any] = {c: pa.string() for c in COLUMNS}
    types.update({c: pa.timestamp("us", tz="UTC") for c in _TIME_COLUMNS})
    types.update({c: pa.decimal128(38, 2) for c in _COST_COLUMNS})
    types.update({c: pa.decimal128(38, 9) for c in _QUANTITY_COLUMNS})
    types["ListUnitPrice"] = pa.decimal128(38, 10)
    schema = pa.schema([pa.field(c, types[c], nullable=False) for c in COLUMNS])
    table = pa.table({c: pa.array([row[c] for row in rows], type=types[c]) for c in COLUMNS}, schema=schema)
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()
