"""Rate cards and the chargeback export (FOCUS-style CSV and Parquet)."""

from __future__ import annotations

import csv
import io
import json
from decimal import Decimal

import pyarrow.parquet as pq
import pytest
from accounting_builders import DEC1, HOUR, T0, accepted, lifecycle, numbered, placed, started, succeeded

from trainyard.core.accounting import RateCardError, allocate_cents, load_rate_card
from trainyard.domain.job import Role
from trainyard.ledger import COLUMNS, chargeback, chargeback_rows, chargeback_totals, period_bounds
from trainyard_accounting.writer import LedgerWriter

CARD = load_rate_card(
    {
        "currency": "USD",
        "versions": [
            {"version": "2026-10", "effective_from": "2026-10-01", "prices": {"H100": "2.50", "L40S": "0.90"}},
            {"version": "2026-11-b", "effective_from": "2026-11-15", "prices": {"H100": "2.00", "*": "1.00"}},
        ],
    }
)
NOV15 = T0 + 14 * 24 * HOUR


def export(ledger: LedgerWriter, **kwargs) -> list[dict[str, str]]:
    data = chargeback(ledger, "2026-11", CARD, "csv", now=DEC1 + HOUR, **kwargs)
    return list(csv.DictReader(io.StringIO(data.decode())))


@pytest.mark.parametrize(
    "events, expected",
    [
        pytest.param(
            lifecycle(gpus=8, started_at=T0 + HOUR, ended_at=T0 + 3 * HOUR),
            [("2026-11-01T01:00:00Z", "2026-11-01T03:00:00Z", "H100", "2026-10", "16.000000000", "40.00")],
            id="a run inside the month is one row: 8 GPUs x 2 h x 2.50",
        ),
        pytest.param(
            lifecycle(gpus=8, placed_at=T0 - 2 * HOUR, started_at=T0 - 2 * HOUR, ended_at=T0 + HOUR),
            [("2026-11-01T00:00:00Z", "2026-11-01T01:00:00Z", "H100", "2026-10", "8.000000000", "20.00")],
            id="a run that began last month is charged only for its hours in this month",
        ),
        pytest.param(
            lifecycle(gpus=1, started_at=NOV15 - HOUR, ended_at=NOV15 + 2 * HOUR),
            [
                ("2026-11-14T23:00:00Z", "2026-11-15T00:00:00Z", "H100", "2026-10", "1.000000000", "2.50"),
                ("2026-11-15T00:00:00Z", "2026-11-15T02:00:00Z", "H100", "2026-11-b", "2.000000000", "4.00"),
            ],
            id="a run across a rate change is split into one slice per rate card version",
        ),
        pytest.param(
            lifecycle(gpus=2, started_at=DEC1 - HOUR, ended_at=None),
            [("2026-11-30T23:00:00Z", "2026-12-01T00:00:00Z", "H100", "2026-11-b", "2.000000000", "4.00")],
            id="a run still open is charged up to the end of the period",
        ),
        pytest.param(
            [
                accepted(
                    roles=[
                        Role(name="trainer", replicas=1, gpus_per_replica=8, gpu_type="H100"),
                        Role(name="eval", replicas=1, gpus_per_replica=2, gpu_type="L40S"),
                    ]
                ),
                placed(at=T0, gpus=8, role="trainer"),
                started(at=T0),
                succeeded(at=T0 + HOUR),
            ],
            [("2026-11-01T00:00:00Z", "2026-11-01T01:00:00Z", "H100", "2026-10", "8.000000000", "20.00")],
            id="only the GPUs the placement holds are charged, at their role's GPU type",
        ),
        pytest.param(
            lifecycle(gpus=8, started_at=DEC1 + HOUR, ended_at=DEC1 + 2 * HOUR),
            [],
            id="a run after the period has no row",
        ),
    ],
)
def test_rows(ledger: LedgerWriter, events, expected):
    ledger.apply(numbered(events))
    rows = export(ledger)
    got = [
        (
            r["ChargePeriodStart"],
            r["ChargePeriodEnd"],
            r["SkuId"],
            r["SkuPriceId"],
            r["ConsumedQuantity"],
            r["BilledCost"],
        )
        for r in rows
    ]
    assert got == expected


def test_every_focus_column_is_filled(ledger: LedgerWriter):
    ledger.apply(numbered(lifecycle(gpus=8, started_at=T0, ended_at=T0 + HOUR)))
    (row,) = export(ledger, cost_centres={"acme": "CC-1234"})
    assert tuple(row) == COLUMNS
    assert row["BillingPeriodStart"] == "2026-11-01T00:00:00Z" and row["BillingPeriodEnd"] == "2026-12-01T00:00:00Z"
    assert row["ServiceName"] == "Trainyard GPU" and row["ResourceId"] == "r1"
    assert row["ConsumedUnit"] == row["PricingUnit"] == "GPU-Hour"
    assert row["ListCost"] == row["BilledCost"] == row["EffectiveCost"] == "20.00"
    assert row["SubAccountName"] == "acme" and row["x_CostCentre"] == "CC-1234" and row["BillingCurrency"] == "USD"
    tags = json.loads(row["Tags"])
    assert {k: tags[k] for k in ("tenant", "team", "queue", "job", "cost_centre")} == {
        "tenant": "acme",
        "team": "vision",
        "queue": "research",
        "job": "j1",
        "cost_centre": "CC-1234",
    }


def test_rounded_rows_add_up_to_the_tenant_total_to_the_cent(ledger: LedgerWriter):
    # Three one-GPU runs of 4 s at 2.50/h: each costs 0.002777... and the
    # tenant owes round(0.008333...) = 0.01; exactly one row carries the cent.
    events = []
    for i in range(3):
        events += lifecycle(f"r{i}", f"j{i}", gpus=1, started_at=T0 + i, ended_at=T0 + i + 4)
    ledger.apply(numbered(events))
    rows = chargeback_rows(ledger, "2026-11", CARD, now=DEC1)
    assert sorted(r["BilledCost"] for r in rows) == [Decimal("0.00"), Decimal("0.00"), Decimal("0.01")]
    assert chargeback_totals(rows) == {"acme": Decimal("0.01")}


def test_csv_and_parquet_hold_the_same_rows(ledger: LedgerWriter):
    events = lifecycle("r1", "j1", gpus=8, started_at=T0 + 0.25, ended_at=NOV15 + 1.5)
    events += lifecycle("r2", "j2", "globex", gpus=3, started_at=T0 + 7, ended_at=T0 + 1000.125, gpu_type="L40S")
    ledger.apply(numbered(events))
    rows = chargeback_rows(ledger, "2026-11", CARD, now=DEC1)
    table = pq.read_table(io.BytesIO(chargeback(ledger, "2026-11", CARD, "parquet", now=DEC1)))
    assert table.column_names == list(COLUMNS)
    assert table.to_pylist() == rows
    assert str(table.schema.field("BilledCost").type) == "decimal128(38, 2)"
    assert str(table.schema.field("ChargePeriodStart").type) == "timestamp[us, tz=UTC]"
    assert sum((r["BilledCost"] for r in rows), Decimal(0)) == sum(chargeback_totals(rows).values())


@pytest.mark.parametrize(
    "card, message",
    [
        pytest.param({"versions": []}, "at least one version", id="a rate card without versions"),
        pytest.param(
            {"versions": [{"version": "a", "effective_from": "2026-11-01", "prices": {"H100": "-1"}}]},
            "must be 0 or more",
            id="a negative price",
        ),
        pytest.param(
            {
                "versions": [
                    {"version": "a", "effective_from": "2026-11-01", "prices": {"H100": "1"}},
                    {"version": "b", "effective_from": "2026-11-01", "prices": {"H100": "2"}},
                ]
            },
            "both take effect on 2026-11-01",
            id="two versions taking effect on the same day",
        ),
        pytest.param(
            {"versions": [{"version": "a", "effective_from": "November", "prices": {"H100": "1"}}]},
            "invalid rate card",
            id="a date that is not a date",
        ),
        pytest.param(
            {
                "currency": "dollars",
                "versions": [{"version": "a", "effective_from": "2026-11-01", "prices": {"H100": "1"}}],
            },
            "ISO 4217",
            id="a currency that is not a code",
        ),
    ],
)
def test_bad_rate_cards_are_refused_with_what_to_fix(card, message):
    with pytest.raises(RateCardError, match=message):
        load_rate_card(card)


def test_usage_the_rate_card_does_not_price_is_an_error_naming_the_gpu_type(ledger: LedgerWriter):
    card = load_rate_card({"versions": [{"version": "v1", "effective_from": "2026-01-01", "prices": {"A100": "1"}}]})
    ledger.apply(numbered(lifecycle(gpus=8, started_at=T0, ended_at=T0 + HOUR)))
    with pytest.raises(RateCardError, match="no price for GPU type 'H100'"):
        chargeback(ledger, "2026-11", card)


def test_usage_before_the_first_rate_card_version_is_an_error(ledger: LedgerWriter):
    card = load_rate_card({"versions": [{"version": "v1", "effective_from": "2026-11-02", "prices": {"*": "1"}}]})
    ledger.apply(numbered(lifecycle(gpus=8, started_at=T0, ended_at=T0 + HOUR)))
    with pytest.raises(RateCardError, match="before the first rate card version"):
        chargeback(ledger, "2026-11", card)


@pytest.mark.parametrize(
    "period, bounds",
    [
        pytest.param("2026-11", (T0, DEC1), id="November 2026"),
        pytest.param("2026-12", (DEC1, DEC1 + 31 * 24 * HOUR), id="December runs into the next year"),
    ],
)
def test_period_bounds(period, bounds):
    assert period_bounds(period) == bounds


@pytest.mark.parametrize("period", ["2026-13", "2026/11", "Nov 2026", ""])
def test_a_bad_period_is_refused(ledger: LedgerWriter, period):
    with pytest.raises(ValueError, match="YYYY-MM"):
        chargeback(ledger, period, CARD)


@pytest.mark.parametrize("period", ["0000-01", "9999-12"])
def test_a_month_outside_the_calendar_that_can_be_read_is_refused(period):
    with pytest.raises(ValueError, match=f"billing period '{period}' is out of range: use a month from 0001-01"):
        period_bounds(period)


def test_an_unknown_format_is_refused(ledger: LedgerWriter):
    with pytest.raises(ValueError, match="'csv' or 'parquet'"):
        chargeback(ledger, "2026-11", CARD, "xlsx")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "exact, rounded",
    [
        pytest.param(["0.333", "0.333", "0.334"], ["0.33", "0.33", "0.34"], id="the largest remainder gets the cent"),
        pytest.param(["0.005", "0.005"], ["0.01", "0.00"], id="on a tie the earlier row gets the cent"),
        pytest.param(["1.999", "0.001"], ["2.00", "0.00"], id="a row rounds up only when the total needs it"),
        pytest.param([], [], id="no rows, no cents"),
    ],
)
def test_allocate_cents(exact, rounded):
    assert allocate_cents([Decimal(x) for x in exact]) == [Decimal(x) for x in rounded]
