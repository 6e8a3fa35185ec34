"""Work lost to our hardware failures (runs failed with ``node_failure``) is
credited back on the chargeback, and the export still reconciles: GPU-seconds
used - credited = billed, gross - credit = net billed."""

from __future__ import annotations

import csv
import io
from decimal import Decimal

import pyarrow.parquet as pq
import pytest
from accounting_builders import DEC1, HOUR, T0, lifecycle, numbered

from trainyard.core.accounting import RateCardError, load_rate_card
from trainyard.ledger import chargeback, chargeback_rows, chargeback_summary, chargeback_totals
from trainyard_accounting.writer import LedgerWriter

NOV15 = T0 + 14 * 24 * HOUR
VERSIONS = [
    {"version": "2026-10", "effective_from": "2026-10-01", "prices": {"H100": "2.50", "L40S": "0.90"}},
    {"version": "2026-11-b", "effective_from": "2026-11-15", "prices": {"H100": "2.00", "*": "1.00"}},
]
# The columns every export had before credits, and the new GPU-second ones.
OLD = ("ResourceId", "ChargePeriodStart", "ChargePeriodEnd", "SkuPriceId", "PricingQuantity", "BilledCost")
SECONDS = ("x_GpuSecondsUsed", "x_GpuSecondsCredited", "x_GpuSecondsBilled")


def card(**fields):
    return load_rate_card({"versions": VERSIONS, **fields})


def rows_of(ledger: LedgerWriter, rate_card, columns=("ChargeCategory", *OLD, *SECONDS)) -> list[tuple[str, ...]]:
    data = chargeback(ledger, "2026-11", rate_card, "csv", now=DEC1)
    return [tuple(r[c] for c in columns) for r in csv.DictReader(io.StringIO(data.decode()))]


def test_a_run_killed_by_a_node_failure_is_credited_in_full_by_default(ledger: LedgerWriter):
    ledger.apply(numbered(lifecycle(gpus=8, started_at=T0 + HOUR, ended_at=T0 + 3 * HOUR, outcome="node_failure")))
    start, end = "2026-11-01T01:00:00Z", "2026-11-01T03:00:00Z"
    assert rows_of(ledger, card()) == [
        ("Usage", "r1", start, end, "2026-10", "16.000000000", "40.00", "57600.000000", "0.000000", "57600.000000"),
        ("Credit", "r1", start, end, "2026-10", "-16.000000000", "-40.00", "0.000000", "57600.000000", "-57600.000000"),
    ]
    summary = chargeback_summary(chargeback_rows(ledger, "2026-11", card(), now=DEC1))
    assert (summary.gross, summary.credit, summary.net) == (Decimal("40.00"), Decimal("40.00"), Decimal("0.00"))
    assert (summary.gpu_seconds_used, summary.gpu_seconds_credited, summary.gpu_seconds_billed) == (
        Decimal("57600"),
        Decimal("57600"),
        Decimal("0"),
    )


def test_only_the_work_since_the_last_checkpoint_is_credited(ledger: LedgerWriter):
    ledger.apply(numbered(lifecycle(gpus=2, started_at=T0, ended_at=T0 + 3 * HOUR, outcome="node_failure")))
    ledger.record_checkpoints("r1", [T0 + HOUR, T0 + 2 * HOUR])
    usage, credit = rows_of(ledger, card())
    assert usage[6] == "15.00" and usage[7] == "21600.000000"  # 2 GPUs x 3 h x 2.50, all of it used
    assert credit[2:4] == ("2026-11-01T02:00:00Z", "2026-11-01T03:00:00Z")
    assert credit[6:] == ("-5.00", "0.000000", "7200.000000", "-7200.000000")  # the last hour's work was lost
    assert chargeback_totals(chargeback_rows(ledger, "2026-11", card(), now=DEC1)) == {"acme": Decimal("10.00")}


@pytest.mark.parametrize(
    "fields, credits",
    [
        pytest.param({}, [("-2.50", "3600.000000"), ("-4.00", "7200.000000")], id="full by default"),
        pytest.param({"hardware_failure_credit": "none"}, [], id="none: billed in full as before"),
        pytest.param(
            {"hardware_failure_credit": 0.5}, [("-1.25", "1800.000000"), ("-2.00", "3600.000000")], id="a fraction"
        ),
        pytest.param(
            {"versions": [VERSIONS[0] | {"hardware_failure_credit": "none"}, VERSIONS[1]]},
            [("-4.00", "7200.000000")],
            id="a version's own policy: credits only from the version that brings them",
        ),
    ],
)
def test_the_rate_card_says_how_much_is_credited(ledger: LedgerWriter, fields, credits):
    ledger.apply(
        numbered(lifecycle(gpus=1, started_at=NOV15 - HOUR, ended_at=NOV15 + 2 * HOUR, outcome="node_failure"))
    )
    rows = rows_of(ledger, card(**fields))
    assert [(r[6], r[8]) for r in rows if r[0] == "Credit"] == credits
    assert [r[6] for r in rows if r[0] == "Usage"] == ["2.50", "4.00"]  # what was used is always shown in full


@pytest.mark.parametrize("outcome", ["workload_error", "preempted", "timeout", "cancelled", "succeeded"])
def test_runs_not_ended_by_our_hardware_get_no_credit(ledger: LedgerWriter, outcome):
    ledger.apply(numbered(lifecycle(gpus=8, started_at=T0, ended_at=T0 + HOUR, outcome=outcome)))
    assert [r[0] for r in rows_of(ledger, card())] == ["Usage"]


# November as exported before credits existed (the same ledger, the same rate card).
BEFORE = [
    ("r1", "2026-11-01T00:00:00.250Z", "2026-11-15T00:00:00Z", "2026-10", "2687.999444444", "6720.00"),
    ("r3", "2026-11-01T00:00:05Z", "2026-11-01T04:00:05Z", "2026-10", "4.000000000", "10.00"),
    ("r1", "2026-11-15T00:00:00Z", "2026-11-15T00:00:01.500Z", "2026-11-b", "0.003333333", "0.01"),
    ("r2", "2026-11-01T00:00:07Z", "2026-11-01T00:16:40.125Z", "2026-10", "0.827604167", "0.75"),
    ("r4", "2026-11-14T23:00:00Z", "2026-11-15T00:00:00Z", "2026-10", "2.000000000", "5.00"),
    ("r4", "2026-11-15T00:00:00Z", "2026-11-15T02:00:00.500Z", "2026-11-b", "4.000277778", "8.00"),
]


def test_a_past_month_keeps_its_usage_rows_and_totals_and_credits_come_on_top(ledger: LedgerWriter):
    events = lifecycle("r1", "j1", gpus=8, started_at=T0 + 0.25, ended_at=NOV15 + 1.5)
    events += lifecycle(
        "r2",
        "j2",
        "globex",
        gpus=3,
        started_at=T0 + 7,
        ended_at=T0 + 1000.125,
        gpu_type="L40S",
        outcome="workload_error",
    )
    events += lifecycle("r3", "j3", gpus=1, started_at=T0 + 5, ended_at=T0 + 4 * HOUR + 5, outcome="preempted")
    events += lifecycle(
        "r4", "j4", "globex", gpus=2, started_at=NOV15 - HOUR, ended_at=NOV15 + 2 * HOUR + 0.5, outcome="node_failure"
    )
    ledger.apply(numbered(events))
    assert rows_of(ledger, card(hardware_failure_credit="none"), OLD) == BEFORE
    rows = chargeback_rows(ledger, "2026-11", card(), now=DEC1)
    assert [row[1 : 1 + len(OLD)] for row in rows_of(ledger, card()) if row[0] == "Usage"] == BEFORE
    assert chargeback_totals([r for r in rows if r["ChargeCategory"] == "Usage"]) == {
        "acme": Decimal("6730.01"),
        "globex": Decimal("13.75"),
    }
    assert chargeback_totals(rows) == {"acme": Decimal("6730.01"), "globex": Decimal("0.75")}
    for tenant in ("acme", "globex"):
        summary = chargeback_summary([r for r in rows if r["SubAccountId"] == tenant])
        assert summary.gross - summary.credit == summary.net == chargeback_totals(rows)[tenant]
        assert summary.gpu_seconds_used - summary.gpu_seconds_credited == summary.gpu_seconds_billed


def test_credit_rows_survive_parquet(ledger: LedgerWriter):
    ledger.apply(numbered(lifecycle(gpus=3, started_at=T0 + 0.125, ended_at=T0 + 100.5, outcome="node_failure")))
    rows = chargeback_rows(ledger, "2026-11", card(hardware_failure_credit="0.25"), now=DEC1)
    table = pq.read_table(io.BytesIO(chargeback(ledger, "2026-11", card(hardware_failure_credit="0.25"), "parquet")))
    assert table.to_pylist() == rows
    assert [r["x_GpuSecondsCredited"] for r in rows] == [Decimal(0), Decimal("75.28125")]


@pytest.mark.parametrize("value", ["most", 1.5, -0.1, "nan", "1/2"])
def test_a_credit_that_is_not_full_none_or_a_fraction_is_refused(value):
    with pytest.raises(RateCardError, match="hardware_failure_credit .* must be 'full', 'none' or a fraction"):
        card(hardware_failure_credit=value)
