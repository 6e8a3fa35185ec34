"""Finance over REST against real NATS and Redis, with a SQLite ledger filled
through LedgerWriter.apply: the chargeback export is for finance only, comes as CSV
or Parquet and reconciles to the ledger to the cent; usage is scoped by role."""

from __future__ import annotations

import csv
import io
import itertools
import json
from collections.abc import AsyncIterator
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import httpx
import msgspec
import pyarrow.parquet as pq
import pytest

from trainyard.bus import Bus
from trainyard.domain.job import JobSpec, Role
from trainyard.events.jobs import (
    JobAccepted,
    JobAdmitted,
    JobEvent,
    JobPlaced,
    ReplicaPlacement,
    RunFailed,
    RunStarted,
    RunSucceeded,
)
from trainyard.ledger import Ledger
from trainyard.settings import Settings
from trainyard.store import Store
from trainyard.testing.auth import Callers
from trainyard_accounting.writer import LedgerWriter
from trainyard_gateway import finance_api
from trainyard_gateway.jobs import JobOperations
from trainyard_gateway.main import build_usage_source
from trainyard_gateway.rest import create_app

T0 = 1_793_491_200.0  # 2026-11-01T00:00:00Z
NOV15 = 1_794_700_800.0  # 2026-11-15T00:00:00Z: the rate card changes
DEC1 = 1_796_083_200.0
HOUR = 3600.0
AS_OF = T0 + 20 * 86_400  # open runs are charged up to here
PRICES = [  # (from, price per GPU-hour by type)
    (T0 - 31 * 86_400, {"H100": Decimal("2.49"), "A100": Decimal("1.29")}),
    (NOV15, {"H100": Decimal("2.29"), "A100": Decimal("1.19")}),
]
RATE_CARD = {
    "currency": "USD",
    "versions": [
        {"version": "2026-10", "effective_from": "2026-10-01", "prices": {"H100": "2.49", "A100": "1.29"}},
        {"version": "2026-11-15", "effective_from": "2026-11-15", "prices": {"H100": "2.29", "A100": "1.19"}},
    ],
}


def headers_of(callers: Callers, caller: str | None) -> dict[str, str]:
    """The headers a caller sends (see trainyard.testing.auth.CALLERS); None: no credentials at all."""
    return {"Authorization": ""} if caller is None else callers.headers(caller)


def lifecycle(
    job: str, tenant: str, gpus: int, gpu_type: str, start: float, end: float | None, outcome: str = "ok"
) -> list[JobEvent]:
    run = f"{job}-r1"
    per = min(gpus, 8)
    spec = JobSpec(
        tenant=tenant,
        queue=f"{tenant}-q",
        name=job,
        roles=[Role(name="trainer", replicas=gpus // per, gpus_per_replica=per, gpu_type=gpu_type)],
    )
    replicas = [
        ReplicaPlacement(role="trainer", replica=i, rank=i, node_id=f"n{i}", gpus=list(range(per)))
        for i in range(gpus // per)
    ]
    events: list[JobEvent] = [
        JobAccepted(at=start - 600, job_id=job, spec=spec, submitted_at=start - 601),
        JobAdmitted(at=start - 2, job_id=job, tenant=tenant, run_id=run, attempt=1),
        JobPlaced(at=start - 1, job_id=job, tenant=tenant, run_id=run, cluster="c1", replicas=replicas),
        RunStarted(at=start, job_id=job, tenant=tenant, run_id=run),
    ]
    if end is not None and outcome == "ok":
        events.append(RunSucceeded(at=end, job_id=job, tenant=tenant, run_id=run))
    elif end is not None:
        events.append(RunFailed(at=end, job_id=job, tenant=tenant, run_id=run, reason=outcome))  # type: ignore[arg-type]
    return events


WORKLOAD = [
    lifecycle("j1", "acme", 8, "H100", T0 + HOUR, T0 + 3 * HOUR),
    lifecycle("j2", "acme", 4, "H100", NOV15 - HOUR, NOV15 + HOUR + 0.123),  # across the rate change
    lifecycle("j3", "globex", 16, "A100", T0 + 5 * 86_400 + 17.5, T0 + 5 * 86_400 + 1234.567, "preempted"),
    lifecycle("j4", "globex", 8, "H100", T0 + 10 * 86_400, None),  # still running: charged up to AS_OF
    lifecycle("j5", "initech", 8, "A100", T0 - 2 * HOUR, T0 + HOUR / 3),  # starts in October
    lifecycle("j6", "initech", 1, "H100", DEC1 - 0.5 * HOUR, DEC1 + HOUR),  # ends in December
]


def expected_totals() -> dict[str, Decimal]:
    """What each tenant owes for November, priced here from the raw run times."""
    exact: dict[str, Decimal] = {}
    for events in WORKLOAD:
        started = next(e.at for e in events if isinstance(e, RunStarted))
        ended = next((e.at for e in events if isinstance(e, (RunSucceeded, RunFailed))), AS_OF)
        spec = events[0].spec  # type: ignore[attr-defined]
        gpus, gpu_type = spec.roles[0].gpus, spec.roles[0].gpu_type
        bounds = [T0, NOV15, DEC1]
        for (lo, hi), (_, prices) in zip(itertools.pairwise(bounds), PRICES, strict=True):
            a, b = max(started, lo), min(ended, hi)
            if b > a:
                seconds = Decimal(repr(b)) - Decimal(repr(a))
                tenant = spec.tenant
                exact[tenant] = exact.get(tenant, Decimal(0)) + gpus * seconds * prices[gpu_type] / 3600
    return {t: v.quantize(Decimal("0.01"), rounding=ROUND_HALF_UP) for t, v in exact.items()}


@pytest.fixture
def ledger_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    card = tmp_path / "rate-card.json"
    card.write_text(json.dumps(RATE_CARD))
    centres = tmp_path / "cost-centres.yaml"
    centres.write_text('version: "1"\ncost_centres:\n  acme: CC-1\n  globex: CC-2\n')
    monkeypatch.setenv("TRAINYARD_RATE_CARD", str(card))
    monkeypatch.setenv("TRAINYARD_COST_CENTRES", str(centres))
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with LedgerWriter(url) as ledger:
        ledger.create_schema()
        events = [e for job in WORKLOAD for e in job]
        assert ledger.apply([(str(i), e) for i, e in enumerate(events, 1)]) == len(events)
    return url


@pytest.fixture
async def client(bus: Bus, store: Store, ledger_url: str, callers: Callers) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(ledger_url=ledger_url)
    app = create_app(
        JobOperations(bus, store),
        store,
        callers.authenticator,
        usage_source=build_usage_source(settings),
        routers=[finance_api.build_router(bus, store, settings)],
    )
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://gateway", headers=callers.headers("finance")
    ) as c:
        yield c  # as finance unless a test says otherwise


async def export(
    client: httpx.AsyncClient, fmt: str = "csv", headers: dict[str, str] | None = None, **params: object
) -> httpx.Response:
    return await client.get(
        "/v1/exports/chargeback", params={"period": "2026-11", "format": fmt, "as_of": AS_OF, **params}, headers=headers
    )


def csv_rows(response: httpx.Response) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(response.text)))


def totals(rows: list[dict[str, object]]) -> dict[str, Decimal]:
    out: dict[str, Decimal] = {}
    for row in rows:
        out[str(row["SubAccountId"])] = out.get(str(row["SubAccountId"]), Decimal(0)) + Decimal(str(row["BilledCost"]))
    return out


# --- roles ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("caller", "status"),
    [
        pytest.param(None, 401, id="a caller with no credentials may not export"),
        pytest.param("acme", 403, id="a researcher may not export"),
        pytest.param("operator", 403, id="an operator may not export"),
        pytest.param("finance", 200, id="finance exports"),
        pytest.param("admin", 200, id="an admin exports"),
    ],
)
async def test_the_chargeback_export_is_for_finance_and_admins(
    client: httpx.AsyncClient, callers: Callers, caller: str | None, status: int
) -> None:
    response = await export(client, headers=headers_of(callers, caller))

    assert response.status_code == status
    if status == 403:
        assert response.json()["code"] == "permission_denied" and "finance" in response.json()["message"]


async def test_finance_naming_a_tenant_gets_that_tenants_rows_only(client: httpx.AsyncClient) -> None:
    response = await export(client, tenant="acme")

    rows = csv_rows(response)
    assert {r["SubAccountId"] for r in rows} == {"acme"}
    assert totals(rows) == {"acme": expected_totals()["acme"]}


# --- formats and reconciliation ------------------------------------------------------------------------


async def test_the_csv_export_reconciles_to_the_ledger_to_the_cent(client: httpx.AsyncClient) -> None:
    response = await export(client, "csv")

    assert response.status_code == 200 and response.headers["content-type"].startswith("text/csv")
    assert 'filename="chargeback-2026-11.csv"' in response.headers["content-disposition"]
    rows = csv_rows(response)
    assert totals(rows) == expected_totals()
    assert response.headers["x-trainyard-billed-total"] == f"{sum(expected_totals().values())} USD"
    assert {(r["SubAccountId"], r["x_CostCentre"]) for r in rows} == {
        ("acme", "CC-1"),
        ("globex", "CC-2"),
        ("initech", "unassigned"),
    }
    assert [r["SkuPriceId"] for r in rows if r["ResourceId"] == "j2-r1"] == ["2026-10", "2026-11-15"]


async def test_a_run_our_hardware_killed_is_credited_and_the_headers_reconcile(
    client: httpx.AsyncClient, ledger_url: str
) -> None:
    with LedgerWriter(ledger_url) as ledger:  # 8 x H100 for 2 h in the first rate card version, node failure
        events = lifecycle("j7", "umbrella", 8, "H100", T0 + HOUR, T0 + 3 * HOUR, "node_failure")
        ledger.apply([(str(i), e) for i, e in enumerate(events, 1000)])

    response = await export(client, tenant="umbrella")

    rows = csv_rows(response)
    assert [(r["ChargeCategory"], r["BilledCost"], r["x_GpuSecondsBilled"]) for r in rows] == [
        ("Usage", "39.84", "57600.000000"),
        ("Credit", "-39.84", "-57600.000000"),
    ]
    assert response.headers["x-trainyard-gross-total"] == "39.84 USD"
    assert response.headers["x-trainyard-credit-total"] == "39.84 USD"
    assert response.headers["x-trainyard-billed-total"] == "0.00 USD"


async def test_the_parquet_export_holds_the_same_rows_as_the_csv(client: httpx.AsyncClient) -> None:
    as_csv = csv_rows(await export(client, "csv"))
    response = await export(client, "parquet")

    assert response.status_code == 200 and response.headers["content-type"] == "application/vnd.apache.parquet"
    table = pq.read_table(io.BytesIO(response.content))
    assert table.column_names == list(as_csv[0])
    rows = table.to_pylist()
    assert totals(rows) == expected_totals()
    assert [(r["ResourceId"], str(r["BilledCost"])) for r in rows] == [
        (r["ResourceId"], r["BilledCost"]) for r in as_csv
    ]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        pytest.param({"period": "2026-13"}, "period", id="a month that does not exist"),
        pytest.param({"period": "November"}, "period", id="a period not written YYYY-MM"),
        pytest.param({"format": "xlsx"}, "format", id="a format other than csv or parquet"),
    ],
)
async def test_a_bad_period_or_format_is_422_naming_the_parameter(
    client: httpx.AsyncClient, params: dict[str, str], field: str
) -> None:
    response = await client.get("/v1/exports/chargeback", params={"period": "2026-11", "format": "csv", **params})

    assert response.status_code == 422
    assert [e["field"] for e in response.json()["errors"]] == [field]


async def test_a_rate_card_that_cannot_price_the_usage_is_a_configuration_error_naming_the_type(
    client: httpx.AsyncClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    card = tmp_path / "h100-only.json"
    card.write_text(
        json.dumps({"versions": [{"version": "v1", "effective_from": "2026-01-01", "prices": {"H100": "2"}}]})
    )
    monkeypatch.setenv("TRAINYARD_RATE_CARD", str(card))

    response = await export(client)

    assert response.status_code == 500
    assert response.json()["code"] == "configuration_error" and "'A100'" in response.json()["message"]


# --- usage by role ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("caller", "params", "status", "tenants"),
    [
        pytest.param("acme", {}, 200, {"acme"}, id="a researcher sees only its own tenant's usage"),
        pytest.param("acme", {"tenant": "globex"}, 403, set(), id="a researcher may not read another tenant's"),
        pytest.param("finance", {}, 200, {"acme", "globex", "initech"}, id="finance sees every tenant"),
        pytest.param("finance", {"tenant": "globex"}, 200, {"globex"}, id="finance may pick one tenant"),
        pytest.param("operator", {}, 403, set(), id="an operator may not read usage"),
    ],
)
async def test_usage_by_role(
    client: httpx.AsyncClient, callers: Callers, caller: str, params: dict[str, str], status: int, tenants: set[str]
) -> None:
    response = await client.get(
        "/v1/usage", params={"from": "2026-11-01", "to": "2026-11-30", **params}, headers=callers.headers(caller)
    )

    assert response.status_code == status
    if status == 200:
        assert {r["tenant"] for r in response.json()} == tenants


async def test_usage_over_a_window_grouped_by_queue_and_job_matches_the_ledger(
    client: httpx.AsyncClient, ledger_url: str
) -> None:
    response = await client.get("/v1/usage", params={"from": "2026-11-01", "to": "2026-11-01", "group_by": "queue,job"})

    assert response.status_code == 200
    rows = {(r["queue"], r["job_id"]): r["gpu_seconds"] for r in response.json()}
    # Only November 1st: j1 (8 GPUs x 2 h) and the November part of j5 (8 GPUs x 20 min).
    assert rows == {("acme-q", "j1"): 8 * 2 * HOUR, ("initech-q", "j5"): pytest.approx(8 * HOUR / 3, abs=1e-3)}
    assert all(set(r) == {"queue", "job_id", "gpu_seconds", "gpu_hours"} for r in response.json())


@pytest.mark.parametrize(
    ("params", "field"),
    [
        pytest.param({"group_by": "colour"}, "group_by", id="an unknown grouping"),
        pytest.param({"from": "last tuesday"}, "from", id="a start that is not a time"),
        pytest.param({"from": "2026-11-10", "to": "2026-11-01"}, "to", id="a window that ends before it starts"),
    ],
)
async def test_bad_usage_parameters_are_422(client: httpx.AsyncClient, params: dict[str, str], field: str) -> None:
    response = await client.get("/v1/usage", params=params)

    assert response.status_code == 422
    assert [e["field"] for e in response.json()["errors"]] == [field]


# --- where the rate card and cost centres come from ---------------------------------------------------


def test_without_settings_the_examples_rate_card_and_cost_centres_are_used() -> None:
    from trainyard.ledger.finance_config import read_cost_centres, read_rate_card

    card = read_rate_card(settings=Settings())
    assert card.currency == "USD" and card.version_at(T0) is not None and card.version_at(T0).price("H100") > 0
    assert read_cost_centres(settings=Settings())["acme"].startswith("CC-")


@pytest.mark.parametrize(
    ("name", "text", "reader", "message"),
    [
        pytest.param(
            "card.json", "{not json", "read_rate_card", "card.json is not valid", id="a rate card that is not JSON"
        ),
        pytest.param(
            "card.json", '{"versions": []}', "read_rate_card", "at least one version", id="a rate card with no versions"
        ),
        pytest.param(
            "cc.yaml",
            "cost_centres: [a, b]",
            "read_cost_centres",
            "invalid cost-centre map",
            id="a cost-centre list instead of a map",
        ),
        pytest.param(
            "cc.yaml",
            "cost_centres:\n  acme: ''\n",
            "read_cost_centres",
            "empty name or cost centre",
            id="a tenant with an empty cost centre",
        ),
    ],
)
def test_bad_finance_files_are_refused_naming_the_file_and_the_problem(
    tmp_path: Path, name: str, text: str, reader: str, message: str
) -> None:
    from trainyard.ledger import finance_config
    from trainyard.ledger.chargeback import RateCardError

    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(RateCardError, match=message) as err:
        getattr(finance_config, reader)(path)
    assert str(path) in str(err.value)


# --- capacity report -----------------------------------------------------------------------------------


async def capacity(
    client: httpx.AsyncClient, headers: dict[str, str] | None = None, **params: object
) -> httpx.Response:
    query = {"from": "2026-11-01", "to": "2026-11-20", "capacity": "H100=64,A100=2x8", "as_of": AS_OF, **params}
    return await client.get("/v1/reports/capacity", params=query, headers=headers)


@pytest.mark.parametrize(
    ("caller", "status"),
    [
        pytest.param(None, 401, id="a caller with no credentials may not read the capacity report"),
        pytest.param("acme", 403, id="a researcher may not read the capacity report"),
        pytest.param("finance", 200, id="finance reads the capacity report"),
        pytest.param("admin", 200, id="an admin reads the capacity report"),
    ],
)
async def test_the_capacity_report_is_for_finance_and_admin(
    client: httpx.AsyncClient, callers: Callers, caller: str | None, status: int
) -> None:
    response = await capacity(client, headers=headers_of(callers, caller))

    assert response.status_code == status
    if status == 403:
        assert response.json()["code"] == "permission_denied"


async def test_the_capacity_report_endpoint_returns_the_report_the_cli_computes(
    client: httpx.AsyncClient, ledger_url: str
) -> None:
    from trainyard.reports import capacity_report

    response = await capacity(client)

    lo, hi = T0, T0 + 20 * 86_400
    with Ledger(ledger_url) as ledger:
        jobs = ledger.jobs(end=hi)
        runs = [r for r in ledger.runs() if (r.placed_at if r.placed_at is not None else r.started_at or hi) < hi]
    expected = capacity_report(runs, jobs, {"A100": 16, "H100": 64}, lo, hi, AS_OF)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    assert response.json() == json.loads(msgspec.json.encode(expected))
    assert response.json()["capacity"] == {"A100": 16, "H100": 64}
    assert any(row["allocated_gpu_hours"] > 0 for row in response.json()["timeline"])


@pytest.mark.parametrize(
    ("params", "field"),
    [
        pytest.param({"from": "2026-11-20", "to": "2026-11-01"}, "to", id="a window that ends before it starts"),
        pytest.param({"bucket": "week"}, "bucket", id="a bucket other than day or hour"),
        pytest.param({"capacity": "H100=lots"}, "capacity", id="a capacity that is not GPUs per type"),
        pytest.param({"from": "November"}, "from", id="a start that is not a date"),
        pytest.param({"to": "9999-12-31"}, "to", id="an end past the last date that can be read"),
        pytest.param({"from": "nan"}, "from", id="a start that is not a number of seconds"),
        pytest.param({"from": "0001-01-01", "to": "9999-12-30"}, "to", id="ten thousand years of day buckets"),
        pytest.param({"from": "2024-01-01", "bucket": "hour"}, "to", id="three years of hour buckets"),
    ],
)
async def test_bad_capacity_report_parameters_are_422(
    client: httpx.AsyncClient, params: dict[str, str], field: str
) -> None:
    response = await capacity(client, **params)

    assert response.status_code == 422
    assert field in {e["field"] for e in response.json()["errors"]}
