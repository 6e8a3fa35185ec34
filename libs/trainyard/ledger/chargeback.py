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
    HARDWARE_FAILURES,
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
    "ChargebackSummary",
    "chargeback_rows",
    "chargeback_summary",
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
GPU_SECONDS = Decimal("0.000001")  # GPU-seconds to the microsecond
CREDIT = "Credit"  # ChargeCategory of a hardware-failure credit row

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
    "x_GpuSecondsUsed",
    "x_GpuSecondsCredited",
    "x_GpuSecondsBilled",
)
_TIME_COLUMNS = ("BillingPeriodStart", "BillingPeriodEnd", "ChargePeriodStart", "ChargePeriodEnd")
_COST_COLUMNS = ("ListCost", "BilledCost", "EffectiveCost")
_QUANTITY_COLUMNS = ("PricingQuantity", "ConsumedQuantity")
_GPU_SECONDS_COLUMNS = ("x_GpuSecondsUsed", "x_GpuSecondsCredited", "x_GpuSecondsBilled")
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

    Each usage row is followed, when its run failed on our hardware and the
    rate card credits such losses, by a ``Credit`` row giving back the lost
    work's share (negative costs).  Runs still open are charged up to
    ``now`` (the current time when not given); pass ``now`` to make an export
    reproducible.  Raises :class:`RateCardError` for usage the rate card
    does not price.
    """
    period_start, period_end = period_bounds(period)
    now = time.time() if now is None else now
    cost_centres = cost_centres or {}
    billing_start, billing_end = _utc(period_start), _utc(period_end)
    runs = ledger.runs(start=period_start, end=period_end)
    lost_from = _lost_work_starts(ledger, runs)
    slices: list[tuple[tuple[Any, ...], dict[str, Any], Decimal]] = []
    with localcontext() as ctx:
        ctx.prec = 60
        for run in runs:
            until = run.ended_at if run.ended_at is not None else now
            lo, hi = max(run.started_at, period_start), min(until, period_end)  # type: ignore[type-var]
            for slice_lo, slice_hi, version in rate_card.slices(lo, hi):
                seconds = _exact(slice_hi) - _exact(slice_lo)
                lost = _lost_span(lost_from.get(run.run_id), run.ended_at, slice_lo, slice_hi)
                fraction = rate_card.credit_fraction(version) if lost else Decimal(0)
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
                    key = (run.tenant, slice_lo, run.run_id, gpu_type)
                    slices.append(((*key, 0), row, gpus * seconds * row["ListUnitPrice"]))
                    if lost is not None and fraction:
                        credited = gpus * (_exact(lost[1]) - _exact(lost[0])) * fraction
                        credit = _credit_row(row, run, gpu_type, gpus, lost, credited, fraction)
                        slices.append(((*key, 1), credit, credited * row["ListUnitPrice"]))
        slices.sort(key=lambda s: s[0])
        # Usage and credits are rounded apart (each to its own tenant total),
        # so a month without credits is billed to the cent as it always was.
        groups: dict[tuple[str, int], list[int]] = {}
        for i, (key, _, _) in enumerate(slices):
            groups.setdefault((key[0], key[-1]), []).append(i)
        for (_, is_credit), indexes in groups.items():
            numerators = [slices[i][2] for i in indexes]
            exact = [n / 3600 for n in numerators]
            cents = allocate_cents(exact, total=round_total(sum(numerators, Decimal(0)) / 3600))
            for i, cost in zip(indexes, cents, strict=True):
                signed = Decimal(0) - cost if is_credit else cost
                slices[i][1].update(ListCost=signed, BilledCost=signed, EffectiveCost=signed)
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
    gpu_seconds = (gpus * seconds).quantize(GPU_SECONDS, rounding=ROUND_HALF_UP)
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
        "x_GpuSecondsUsed": gpu_seconds,
        "x_GpuSecondsCredited": Decimal(0).quantize(GPU_SECONDS),
        "x_GpuSecondsBilled": gpu_seconds,
    }


def _lost_work_starts(ledger: Ledger, runs: list[LedgerRun]) -> dict[str, float]:
    """Where the lost work of each run that failed on our hardware begins: its
    last checkpoint inside the run, else its start (as the ledger's lost_seconds)."""
    failed = [
        run
        for run in runs
        if run.outcome is not None
        and run.outcome.removeprefix("failed:") in HARDWARE_FAILURES
        and run.started_at is not None
        and run.ended_at is not None
    ]
    checkpoints = ledger.checkpoints([run.run_id for run in failed]) if failed else {}
    starts: dict[str, float] = {}
    for run in failed:
        inside = [c for c in checkpoints.get(run.run_id, ()) if run.started_at <= c <= run.ended_at]  # type: ignore[operator]
        starts[run.run_id] = max(inside) if inside else run.started_at  # type: ignore[assignment]
    return starts


def _lost_span(since: float | None, ended_at: float | None, lo: float, hi: float) -> tuple[float, float] | None:
    """The part of [since, ended_at) inside the slice [lo, hi), if any."""
    if since is None or ended_at is None:
        return None
    start, end = max(since, lo), min(ended_at, hi)
    return (start, end) if end > start else None


def _credit_row(
    usage: dict[str, Any],
    run: LedgerRun,
    gpu_type: str,
    gpus: int,
    lost: tuple[float, float],
    credited: Decimal,
    fraction: Decimal,
) -> dict[str, Any]:
    share = "all" if fraction == 1 else f"{fraction * 100:g}%"
    hours = (credited / 3600).quantize(QUANTITY, rounding=ROUND_HALF_UP)
    gpu_seconds = credited.quantize(GPU_SECONDS, rounding=ROUND_HALF_UP)
    return usage | {
        "ChargeCategory": CREDIT,
        "ChargeDescription": (
            f"Credit: {share} of the work of {gpus} x {gpu_type} GPU lost when run {run.run_id} of job "
            f"{run.job_id} failed on our hardware ({run.outcome})"
        ),
        "ChargePeriodStart": _utc(lost[0]),
        "ChargePeriodEnd": _utc(lost[1]),
        "PricingQuantity": Decimal(0) - hours,
        "ConsumedQuantity": Decimal(0).quantize(QUANTITY),
        "x_GpuSecondsUsed": Decimal(0).quantize(GPU_SECONDS),
        "x_GpuSecondsCredited": gpu_seconds,
        "x_GpuSecondsBilled": Decimal(0) - gpu_seconds,
    }


def chargeback_totals(rows: list[dict[str, Any]]) -> dict[str, Decimal]:
    """BilledCost per tenant (SubAccountName) of export rows."""
    totals: dict[str, Decimal] = {}
    for row in rows:
        totals[row["SubAccountName"]] = totals.get(row["SubAccountName"], Decimal(0)) + row["BilledCost"]
    return totals


class ChargebackSummary(msgspec.Struct, frozen=True):
    """What export rows add up to: money (gross - credit = net billed) and
    GPU-seconds (used - credited = billed)."""

    gross: Decimal
    credit: Decimal  # positive: the amount taken off
    net: Decimal
    gpu_seconds_used: Decimal
    gpu_seconds_credited: Decimal
    gpu_seconds_billed: Decimal

    def describe(self, currency: str) -> str:
        text = f"billed total {self.net} {currency}"
        if self.credit:
            text += f" (gross {self.gross}, hardware-failure credit {self.credit})"
        return text


def chargeback_summary(rows: list[dict[str, Any]]) -> ChargebackSummary:
    """Totals of export rows (from :func:`chargeback_rows`, possibly filtered)."""
    zero, cents = Decimal(0).quantize(GPU_SECONDS), Decimal("0.00")
    gross = sum((r["BilledCost"] for r in rows if r["ChargeCategory"] != CREDIT), cents)
    credit = cents - sum((r["BilledCost"] for r in rows if r["ChargeCategory"] == CREDIT), cents)
    used, credited = (sum((r[c] for r in rows), zero) for c in ("x_GpuSecondsUsed", "x_GpuSecondsCredited"))
    return ChargebackSummary(gross, credit, gross - credit, used, credited, used - credited)


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
    types.update({c: pa.decimal128(38, 6) for c in _GPU_SECONDS_COLUMNS})
    types["ListUnitPrice"] = pa.decimal128(38, 10)
    schema = pa.schema([pa.field(c, types[c], nullable=False) for c in COLUMNS])
    table = pa.table({c: pa.array([row[c] for row in rows], type=types[c]) for c in COLUMNS}, schema=schema)
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()
