"""The ledger's job records the capacity report reads (accepted, cancelled,
GPUs asked for), on SQLite and, when TRAINYARD_TEST_POSTGRES_URL is set,
PostgreSQL; and a report computed from a ledger filled with lifecycle events."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from reports_builders import DAY, HOUR, T0

from trainyard.domain.job import JobSpec, Role
from trainyard.events.jobs import (
    JobAccepted,
    JobAdmitted,
    JobCancelled,
    JobPlaced,
    ReplicaPlacement,
    RunStarted,
    RunSucceeded,
)
from trainyard.reports import capacity_report
from trainyard_accounting.writer import LedgerWriter

KINDS = ["sqlite", *(["postgresql"] if os.environ.get("TRAINYARD_TEST_POSTGRES_URL") else [])]


@pytest.fixture(params=KINDS)
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LedgerWriter]:
    url = (
        f"sqlite:///{tmp_path / 'ledger.db'}"
        if request.param == "sqlite"
        else os.environ["TRAINYARD_TEST_POSTGRES_URL"]
    )
    made = LedgerWriter(url, prefix=f"r{uuid.uuid4().hex[:12]}_")
    made.create_schema()
    yield made
    made.drop_schema()
    made.close()


def accept(job: str, tenant: str, at: float, roles: list[Role]) -> JobAccepted:
    return JobAccepted(
        at=at, job_id=job, spec=JobSpec(tenant=tenant, queue="q", name=job, roles=roles), submitted_at=at - 1
    )


def run_events(job: str, tenant: str, placed: float, ended: float, gpus: int = 8) -> list:
    run = f"{job}-r1"
    replicas = [ReplicaPlacement(role="trainer", replica=0, rank=0, node_id="n1", gpus=list(range(gpus)))]
    return [
        JobAdmitted(at=placed - 1, job_id=job, tenant=tenant, run_id=run, attempt=1),
        JobPlaced(at=placed, job_id=job, tenant=tenant, run_id=run, cluster="c1", replicas=replicas),
        RunStarted(at=placed + 1, job_id=job, tenant=tenant, run_id=run),
        RunSucceeded(at=ended, job_id=job, tenant=tenant, run_id=run),
    ]


def fill(ledger: LedgerWriter) -> None:
    events = [
        accept("j1", "acme", T0, [Role(name="trainer", gpus_per_replica=8)]),
        *run_events("j1", "acme", T0 + HOUR, T0 + 3 * HOUR),
        accept(
            "j2",
            "globex",
            T0 + 2 * HOUR,
            [Role(name="a", gpus_per_replica=4), Role(name="b", replicas=2, gpus_per_replica=1, gpu_type="A100")],
        ),
        accept("j3", "acme", T0 + 3 * HOUR, [Role(name="trainer", gpus_per_replica=2)]),
        JobCancelled(at=T0 + 5 * HOUR, job_id="j3", tenant="acme"),
        accept("j4", "acme", T0 + 2 * DAY, [Role(name="trainer")]),
    ]
    ledger.apply([(str(i), e) for i, e in enumerate(events, 1)])


def test_jobs_carry_acceptance_cancellation_and_the_gpus_asked_for(ledger: LedgerWriter) -> None:
    fill(ledger)

    jobs = {j.job_id: j for j in ledger.jobs()}

    assert sorted(jobs) == ["j1", "j2", "j3", "j4"]
    assert jobs["j2"].gpus_by_type == {"A100": 2, "H100": 4} and jobs["j2"].gpus == 6
    assert (jobs["j3"].accepted_at, jobs["j3"].cancelled_at) == (T0 + 3 * HOUR, T0 + 5 * HOUR)
    assert [j.job_id for j in ledger.jobs(start=T0 + 6 * HOUR, end=T0 + DAY)] == ["j1", "j2"]
    assert [j.job_id for j in ledger.jobs(tenant="globex")] == ["j2"]


def test_a_report_from_the_ledger_has_the_queue_waits_and_pending_demand_of_its_jobs(ledger: LedgerWriter) -> None:
    fill(ledger)

    report = capacity_report(ledger.runs(), ledger.jobs(end=T0 + DAY), {"H100": 16, "A100": 8}, T0, T0 + DAY, T0 + DAY)

    waits = {w.tenant: w for w in report.waits}
    assert (waits["acme"].placements, waits["acme"].p50_s) == (1, HOUR)
    assert (waits["globex"].placements, waits["globex"].still_waiting) == (0, 1)
    by_type = {r.gpu_type: r for r in report.timeline}
    # j1 8 GPUs x 1 h waiting, j3 2 x 2 h until cancelled, j2 4 H100 + 2 A100 x 22 h until the end of the day.
    assert by_type["H100"].pending_gpu_hours == pytest.approx(8 + 4 + 4 * 22)
    assert by_type["A100"].pending_gpu_hours == pytest.approx(2 * 22)
    assert by_type["H100"].allocated_gpu_hours == pytest.approx(8 * 2)
