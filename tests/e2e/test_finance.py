"""Finance on the whole local stack: jobs run, the month's chargeback is
exported through the API (as finance) and by the CLI and reconciles to the
ledger to the cent, and the capacity report is written as HTML and CSV."""

from __future__ import annotations

import asyncio
import csv
import io
import subprocess
import sys
import time
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest

from trainyard.ledger import Ledger, chargeback_rows, chargeback_totals, period_bounds
from trainyard.ledger.finance_config import read_rate_card
from trainyard.local import LocalStack
from trainyard.store import Store, views
from trainyard.testing.auth import issue_at

pytestmark = pytest.mark.e2e

JOBS = [  # (job id, tenant, GPUs per replica, replicas, seconds)
    ("fin-1", "acme", 8, 1, 0.6),
    ("fin-2", "acme", 2, 1, 0.9),
    ("fin-3", "globex", 8, 2, 0.7),
    ("fin-4", "globex", 1, 1, 1.1),
    ("fin-5", "initech", 4, 1, 0.5),
]
# Jobs of a second cost fractions of a cent at real prices; these prices make
# every tenant's bill dollars with odd cents.
RATE_CARD = """{"currency": "USD", "versions": [
  {"version": "e2e-1", "effective_from": "2026-01-01", "prices": {"H100": "1234.5678", "*": "99.99"}},
  {"version": "e2e-2", "effective_from": "2026-12-01", "prices": {"H100": "2345.6789", "*": "88.88"}}]}"""


@pytest.fixture(autouse=True)
def rate_card(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """In the environment before the stack starts (autouse fixtures come first),
    so the gateway, the CLI and the test read the same card."""
    path = tmp_path / "rate-card.json"
    path.write_text(RATE_CARD)
    monkeypatch.setenv("TRAINYARD_RATE_CARD", str(path))
    monkeypatch.delenv("TRAINYARD_COST_CENTRES", raising=False)  # the examples/ default
    return path


def expected_totals(ledger: Ledger, period_start: float, period_end: float) -> dict[str, Decimal]:
    """Each tenant's bill priced here, run by run, from the ledger's raw times."""
    card = read_rate_card()
    exact: dict[str, Decimal] = {}
    for run in ledger.runs(start=period_start, end=period_end):
        assert run.ended_at is not None and run.started_at is not None
        for lo, hi, version in card.slices(max(run.started_at, period_start), min(run.ended_at, period_end)):
            seconds = Decimal(repr(hi)) - Decimal(repr(lo))
            for gpu_type, gpus in run.gpus_by_type.items():
                cost = gpus * seconds * version.price(gpu_type) / 3600
                exact[run.tenant] = exact.get(run.tenant, Decimal(0)) + cost
    return {t: v.quantize(Decimal("0.01"), rounding=ROUND_HALF_UP) for t, v in exact.items()}


def totals(rows: list[dict[str, object]]) -> dict[str, Decimal]:
    out: dict[str, Decimal] = {}
    for row in rows:
        out[str(row["SubAccountId"])] = out.get(str(row["SubAccountId"]), Decimal(0)) + Decimal(str(row["BilledCost"]))
    return out


async def run_jobs(stack: LocalStack) -> None:
    assert stack.redis
    store = Store.from_url(stack.redis.admin_url)
    try:
        async with httpx.AsyncClient(base_url=stack.api_url, timeout=10, headers=stack.admin_headers()) as client:
            for job_id, tenant, gpus, replicas, seconds in JOBS:
                body = {
                    "job_id": job_id,
                    "tenant": tenant,
                    "queue": "default",
                    "name": job_id,
                    "simulated_duration_s": seconds,
                    "roles": [{"name": "trainer", "replicas": replicas, "gpus_per_replica": gpus, "gpu_type": "H100"}],
                }
                assert (await client.post("/v1/jobs", json=body)).status_code == 202
        deadline = time.monotonic() + 120
        while (await views.status_counts(store)).get("succeeded", 0) < len(JOBS):
            assert time.monotonic() < deadline, await views.status_counts(store)
            await asyncio.sleep(0.25)
    finally:
        await store.close()
    with Ledger(stack.ledger_url) as ledger:
        while sum(1 for r in await asyncio.to_thread(ledger.runs) if r.ended_at is not None) < len(JOBS):
            assert time.monotonic() < deadline, "the ledger did not close every run"
            await asyncio.sleep(0.25)


def trainyard(*args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "trainyard.cli.main", *args], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return result


async def test_the_months_chargeback_reconciles_to_the_ledger_and_the_capacity_report_is_written(
    stack: LocalStack, tmp_path: Path
) -> None:
    await run_jobs(stack)
    with Ledger(stack.ledger_url) as ledger:
        first = min(r.started_at for r in ledger.runs() if r.started_at is not None)
        period = time.strftime("%Y-%m", time.gmtime(first))
        lo, hi = period_bounds(period)
        expected = expected_totals(ledger, lo, hi)
        library = chargeback_totals(chargeback_rows(ledger, period, read_rate_card(), now=hi))
    assert set(expected) == {"acme", "globex", "initech"} and all(v > 0 for v in expected.values())
    assert library == expected

    assert stack.nats
    callers = await issue_at(stack.nats.admin_url)
    finance, acme = callers.headers("finance"), callers.headers("acme")
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=30) as client:
        params = {"period": period, "format": "csv"}
        denied = await client.get("/v1/exports/chargeback", params=params, headers=acme)
        as_csv = await client.get("/v1/exports/chargeback", params=params, headers=finance)
        as_parquet = await client.get("/v1/exports/chargeback", params={**params, "format": "parquet"}, headers=finance)
        acme_usage = (await client.get("/v1/usage", headers=acme)).json()
        all_usage = (await client.get("/v1/usage", params={"group_by": "tenant"}, headers=finance)).json()

    assert denied.status_code == 403
    assert as_csv.status_code == 200 and as_parquet.status_code == 200
    csv_rows = list(csv.DictReader(io.StringIO(as_csv.text)))
    assert {r["x_CostCentre"] for r in csv_rows if r["SubAccountId"] == "acme"} == {"CC-1001-research"}
    assert totals(csv_rows) == expected
    assert totals(pq.read_table(io.BytesIO(as_parquet.content)).to_pylist()) == expected
    assert {r["tenant"] for r in acme_usage} == {"acme"}
    assert {r["tenant"] for r in all_usage} == {"acme", "globex", "initech"}

    # The CLI reads the stack's ledger directly, and through the API as finance.
    direct, via_api = tmp_path / "direct.csv", tmp_path / "api.parquet"
    await asyncio.to_thread(
        trainyard,
        "export",
        "chargeback",
        "--period",
        period,
        "--output",
        str(direct),
        "--data-dir",
        str(stack.data_dir),
    )
    await asyncio.to_thread(
        trainyard,
        "export",
        "chargeback",
        "--period",
        period,
        "--format",
        "parquet",
        "--via-api",
        "--output",
        str(via_api),
        "--data-dir",
        str(stack.data_dir),
    )
    assert totals(list(csv.DictReader(io.StringIO(direct.read_text())))) == expected
    assert totals(pq.read_table(via_api).to_pylist()) == expected

    usage = await asyncio.to_thread(
        trainyard, "report", "usage", "--group-by", "tenant,job", "--csv", "--data-dir", str(stack.data_dir)
    )
    usage_rows = list(csv.DictReader(io.StringIO(usage.stdout)))
    assert {r["job_id"] for r in usage_rows} == {job_id for job_id, *_ in JOBS}
    assert {r["tenant"] for r in usage_rows} == {"acme", "globex", "initech"}

    # The capacity report for today, capacity from the stack's NODES projection.
    today = time.strftime("%Y-%m-%d", time.gmtime(first))
    out = tmp_path / "report"
    await asyncio.to_thread(
        trainyard,
        "report",
        "capacity",
        "--from",
        today,
        "--to",
        today,
        "--out",
        str(out),
        "--bucket",
        "hour",
        "--data-dir",
        str(stack.data_dir),
    )
    html = (out / "capacity.html").read_text()
    assert "<svg" in html and "least-squares" in html
    rows = list(csv.DictReader(io.StringIO((out / "capacity.csv").read_text())))
    assert len(rows) == 24 and {r["gpu_type"] for r in rows} == {"H100"}
    assert {r["capacity_gpus"] for r in rows} == {str(stack.config.nodes * stack.config.gpus_per_node)}
    allocated = sum(float(r["allocated_gpu_hours"]) for r in rows)
    with Ledger(stack.ledger_url) as ledger:
        used = sum(r.gpu_seconds or 0.0 for r in ledger.runs()) / 3600
    assert allocated >= used > 0
    waits = list(csv.DictReader(io.StringIO((out / "queue_wait.csv").read_text())))
    assert {w["tenant"] for w in waits} == {"acme", "globex", "initech"}
