"""Properties of the ledger under any delivery: duplicates, redelivered
batches and shuffles never change what is charged."""

from __future__ import annotations

import csv
import io
from decimal import ROUND_HALF_UP, Decimal

from accounting_builders import DEC1, HOUR, T0, accepted, admitted, cancelled, failed, placed, started, succeeded
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainyard.core.accounting import load_rate_card, meter_run, overlap
from trainyard.ledger import chargeback, chargeback_rows, chargeback_totals

DAY = 24 * HOUR
GPU_TYPES = ("H100", "A100", "L40S")
PRICES = {"H100": Decimal("2.37"), "A100": Decimal("1.61"), "L40S": Decimal("0.83")}
CARD = load_rate_card({"versions": [{"version": "v1", "effective_from": "2026-01-01", "prices": PRICES}]})
OUTCOMES = ("succeeded", "preempted", "node_failure", "workload_error", "cancelled", None)
NOW = DEC1 + DAY

run_strategy = st.fixed_dictionaries(
    {
        "tenant": st.sampled_from(("acme", "globex", "initech")),
        "job": st.integers(0, 5),
        "gpus": st.integers(1, 64),
        "placed_at": st.integers(int(T0 - 5 * DAY), int(DEC1 + 2 * DAY)),
        "idle": st.integers(0, 3600),
        "duration": st.integers(0, 3 * int(DAY)),
        "outcome": st.sampled_from(OUTCOMES),
    }
)


def run_events(i: int, run: dict) -> list:
    run_id, job, tenant = f"r{i}", f"{run['tenant']}-j{run['job']}", run["tenant"]
    start = run["placed_at"] + run["idle"]
    end = start + run["duration"]
    events = [
        admitted(run_id, job, tenant, at=run["placed_at"] - 1),
        placed(run_id, job, tenant, at=run["placed_at"], gpus=run["gpus"]),
        started(run_id, job, tenant, at=start),
    ]
    outcome = run["outcome"]
    if outcome == "succeeded":
        events.append(succeeded(run_id, job, tenant, at=end))
    elif outcome == "cancelled":
        events.append(cancelled(job, tenant, at=end, run=run_id))
    elif outcome is not None:
        events.append(failed(run_id, job, tenant, at=end, reason=outcome))
    return events


@st.composite
def deliveries(draw):
    """Runs, and one way JetStream might deliver their events to the ledger."""
    runs = draw(st.lists(run_strategy, max_size=12))
    jobs = sorted({(r["tenant"], r["job"]) for r in runs})
    gpu_type = {job: draw(st.sampled_from(GPU_TYPES)) for job in jobs}
    events = [e for i, run in enumerate(runs) for e in run_events(i, run)]
    events += [accepted(f"{t}-j{j}", at=T0 - 6 * DAY, tenant=t, gpu_type=gpu_type[(t, j)]) for t, j in jobs]
    delivered = [(str(seq), e) for seq, e in enumerate(events, start=1)]
    if delivered:
        # A producer that published again: the same event under a new sequence.
        again = draw(st.lists(st.sampled_from(delivered), max_size=5))
        delivered += [(str(1000 + n), e) for n, (_, e) in enumerate(again)]
        # A consumer that lost its ack: the same sequence delivered twice.
        delivered += draw(st.lists(st.sampled_from(delivered), max_size=5))
    delivered = draw(st.permutations(delivered))
    cuts = sorted(draw(st.lists(st.integers(0, len(delivered)), max_size=6)))
    batches = [delivered[a:b] for a, b in zip([0, *cuts], [*cuts, len(delivered)], strict=True)]
    return runs, gpu_type, batches


def cents(seconds_by_tenant_and_type: dict[tuple[str, str], float]) -> dict[str, Decimal]:
    """GPU-seconds by (tenant, GPU type) priced with PRICES, per tenant, rounded to the cent."""
    exact: dict[str, Decimal] = {}
    for (tenant, kind), seconds in seconds_by_tenant_and_type.items():
        exact[tenant] = exact.get(tenant, Decimal(0)) + Decimal(int(seconds)) * PRICES[kind]
    return {t: (v / 3600).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP) for t, v in exact.items()}


def lost_in_november(runs: list[dict], gpu_type: dict) -> dict[tuple[str, str], float]:
    lost: dict[tuple[str, str], float] = {}
    for r in runs:
        start = r["placed_at"] + r["idle"]
        seconds = r["gpus"] * overlap(start, start + r["duration"], T0, DEC1)
        if r["outcome"] == "node_failure" and seconds:
            key = (r["tenant"], gpu_type[(r["tenant"], r["job"])])
            lost[key] = lost.get(key, 0) + seconds
    return lost


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(delivery=deliveries())
def test_ledger_equals_the_sum_of_run_intervals_and_exports_match_to_the_cent(make_ledger, delivery):
    runs, gpu_type, batches = delivery
    ledger = make_ledger()
    try:
        for batch in batches:
            ledger.apply(batch)
        # 1. The ledger holds one row per run and equals the sum of the run intervals.
        ended = [r for r in runs if r["outcome"] is not None]
        assert len(ledger.runs()) == len(runs)
        assert ledger.total_gpu_seconds() == sum(r["gpus"] * r["duration"] for r in ended)
        expected_now = sum(
            r["gpus"] * (r["duration"] if r["outcome"] else max(0, NOW - r["placed_at"] - r["idle"])) for r in runs
        )
        assert ledger.total_gpu_seconds(now=NOW) == expected_now
        # 2. Usage in November, per tenant and GPU type, is each run's interval clipped to the month.
        expected: dict[tuple[str, str], float] = {}
        for r in runs:
            start = r["placed_at"] + r["idle"]
            end = start + r["duration"] if r["outcome"] else NOW
            seconds = r["gpus"] * overlap(start, end, T0, DEC1)
            if seconds:
                key = (r["tenant"], gpu_type[(r["tenant"], r["job"])])
                expected[key] = expected.get(key, 0) + seconds
        usage = ledger.usage(start=T0, end=DEC1, now=NOW, group_by=("tenant", "gpu_type"))
        assert usage == expected
        # 3. The export's usage rows add up, per tenant and to the cent, to the ledger's usage
        # priced; its credits to the November part of the runs our hardware killed (no
        # checkpoints here: the whole run is lost work); what is billed is the difference.
        owed, credit = cents(usage), cents(lost_in_november(runs, gpu_type))
        rows = chargeback_rows(ledger, "2026-11", CARD, now=NOW)
        assert chargeback_totals([row for row in rows if row["ChargeCategory"] == "Usage"]) == owed
        # (a credit row for a few GPU-seconds is kept even where its cost rounds to 0.00)
        credited = chargeback_totals([r for r in rows if r["ChargeCategory"] == "Credit"])
        assert {t: -v for t, v in credited.items()} == credit
        owed = {t: v - credit.get(t, Decimal(0)) for t, v in owed.items()}
        assert chargeback_totals(rows) == owed
        hours = sum(row["ConsumedQuantity"] for row in rows)
        assert abs(hours * 3600 - sum(Decimal(int(s)) for s in usage.values())) < Decimal("0.0001") * (len(rows) + 1)
        exported: dict[str, Decimal] = {}
        for row in csv.DictReader(io.StringIO(chargeback(ledger, "2026-11", CARD, "csv", now=NOW).decode())):
            exported[row["SubAccountName"]] = exported.get(row["SubAccountName"], Decimal(0)) + Decimal(
                row["BilledCost"]
            )
        assert exported == owed
    finally:
        ledger.drop_schema()


@settings(max_examples=200, deadline=None)
@given(
    run=run_strategy,
    extra=st.lists(st.integers(0, 3), max_size=4),
    checkpoints=st.lists(st.integers(int(T0 - 5 * DAY), int(DEC1 + 6 * DAY)), max_size=4),
    data=st.data(),
)
def test_metering_a_run_ignores_duplicates_and_order(run, extra, checkpoints, data):
    events = run_events(0, run)
    events += [events[i] for i in extra if i < len(events)]
    shuffled = data.draw(st.permutations(events))
    assert meter_run("r0", shuffled, checkpoints=checkpoints, now=NOW) == meter_run(
        "r0", events, checkpoints=checkpoints, now=NOW
    )
    usage = meter_run("r0", shuffled, now=NOW)
    assert usage is not None
    assert usage.gpu_seconds == run["gpus"] * (
        run["duration"] if run["outcome"] else max(0, NOW - run["placed_at"] - run["idle"])
    )
    assert 0 <= usage.lost_seconds <= usage.gpu_seconds
