"""The services' Prometheus metrics and decision logs after real cycles
against NATS and Redis: queue depth per queue, cycle times, decision latency
(submitted -> admitted -> placed), projection and ledger lag, dead letters;
and each decision logged at INFO with its job id and run id as fields."""

from __future__ import annotations

import asyncio
import logging
import time

import httpx
import pytest
from test_placement_cycle import NOW, harness

from trainyard.bus import Bus, ConsumerSpec, run_consumer
from trainyard.bus import deadletters as dlq
from trainyard.core.admission import AdmissionPolicy
from trainyard.domain import JobSpec, Role
from trainyard.events import JobAccepted, subjects
from trainyard.observability.logs import ATTRIBUTE, KeyValueFormatter
from trainyard.observability.metrics import AdmissionMetrics, LedgerMetrics, PlacementMetrics, ProjectionMetrics
from trainyard.settings import Settings
from trainyard.store import Store
from trainyard.testing.auth import Callers
from trainyard.testing.publish import publish_event
from trainyard.testing.waiting import eventually
from trainyard_accounting.handlers import LedgerHandler
from trainyard_accounting.writer import LedgerWriter
from trainyard_admission.cycle import AdmissionCycle
from trainyard_gateway import dlq_api
from trainyard_gateway.jobs import JobOperations
from trainyard_gateway.metrics import GatewayMetrics
from trainyard_gateway.rest import create_app


def spec(tenant: str, queue: str, gpus: int = 8) -> JobSpec:
    return JobSpec(tenant=tenant, queue=queue, roles=[Role(name="trainer", gpus_per_replica=gpus)])


def fields(caplog: pytest.LogCaptureFixture, message: str) -> list[dict[str, object]]:
    return [getattr(r, ATTRIBUTE) for r in caplog.records if r.getMessage() == message]


async def test_a_cycle_exports_queue_depth_cycle_time_and_decision_latency_and_logs_each_decision(
    bus: Bus, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with harness(bus, store) as h:
        for node in ("n1", "n2"):
            await h.node(node)
        for job_id, tenant, queue in [("a", "acme", "default"), ("b", "acme", "default"), ("c", "globex", "research")]:
            await h.submit(job_id, spec(tenant, queue), admit=False)  # submitted at NOW - 500
        await h.settle()
        admission = AdmissionMetrics()
        cycle = AdmissionCycle(
            bus, store, h.jobs, AdmissionPolicy(), lambda: NOW, node_projector=(h.nodes,), metrics=admission
        )
        assert await cycle.run_once() == 2  # 16 GPUs: two of the three 8-GPU jobs
        await h.settle()
        placement = PlacementMetrics()
        assert await h.cycle(clock=NOW + 2.5, metrics=placement).run_once() == 2

    a = admission.registry.get_sample_value
    assert a("trainyard_queue_pending_jobs", {"tenant": "globex", "queue": "research"}) == 1
    assert a("trainyard_queue_pending_gpus", {"tenant": "globex", "queue": "research"}) == 8
    assert (
        a("trainyard_queue_pending_jobs", {"tenant": "acme", "queue": "default"}) is None
    )  # emptied in its first cycle
    assert a("trainyard_admission_cycle_seconds_count") == 1 and a("trainyard_admission_cycle_seconds_sum") > 0
    assert a("trainyard_admission_last_cycle_timestamp_seconds") == pytest.approx(time.time(), abs=60)
    assert a("trainyard_admission_decisions_total", {"decision": "admitted"}) == 2
    assert a("trainyard_decision_latency_seconds_count", {"stage": "submitted_to_admitted"}) == 2
    assert a("trainyard_decision_latency_seconds_sum", {"stage": "submitted_to_admitted"}) == 2 * 500.0
    p = placement.registry.get_sample_value
    assert p("trainyard_placement_decisions_total", {"decision": "placed"}) == 2
    assert p("trainyard_decision_latency_seconds_sum", {"stage": "admitted_to_placed"}) == 2 * 2.5
    assert p("trainyard_placement_cycle_seconds_count") == 1 and p("trainyard_placement_waiting_jobs") == 2

    admitted = fields(caplog, "job admitted")
    assert {(f["job_id"], f["run_id"], f["decision"]) for f in admitted} == {
        ("a", "a-r1", "admitted"),
        ("b", "b-r1", "admitted"),
    }
    placed = {f["job_id"]: f for f in fields(caplog, "run placed")}
    assert placed["a"]["run_id"] == "a-r1" and placed["a"]["nodes"] in (["n1"], ["n2"])
    record = next(r for r in caplog.records if r.getMessage() == "run placed")
    line = KeyValueFormatter("%(levelname)s %(message)s").format(record)
    assert line.startswith("INFO run placed decision=placed job_id=") and " run_id=" in line and " nodes=n" in line


async def test_a_shrinking_queue_reads_zero_rather_than_its_last_depth() -> None:
    metrics = AdmissionMetrics()
    metrics.set_queues({("acme", "q"): (3, 24)})
    metrics.set_queues({})
    assert metrics.registry.get_sample_value("trainyard_queue_pending_jobs", {"tenant": "acme", "queue": "q"}) == 0


async def test_projection_lag_and_ledger_lag_follow_the_stream(bus: Bus, store: Store, tmp_path) -> None:  # type: ignore[no-untyped-def]
    for i in range(5):
        accepted = JobAccepted(at=NOW, job_id=f"j{i}", spec=spec("acme", "default"), submitted_at=NOW)
        await publish_event(bus, accepted, msg_id=f"j{i}:acc")
    ledger_metrics = LedgerMetrics()
    await ledger_metrics.refresh(bus, now=lambda: time.time() + 100)
    g = ledger_metrics.registry.get_sample_value
    assert g("trainyard_ledger_lag_events") == 5 and g("trainyard_ledger_applied_sequence") == 0
    assert g("trainyard_ledger_lag_seconds") == pytest.approx(100, abs=30)

    ledger = LedgerWriter(f"sqlite:///{tmp_path / 'ledger.db'}")
    ledger.create_schema()
    spec_ = ConsumerSpec(stream="JOBS", durable="accounting", filter_subject=subjects.JOBS_ALL)
    stop = asyncio.Event()
    consuming = asyncio.create_task(run_consumer(bus, spec_, LedgerHandler(ledger, ledger_metrics), stop))

    async def caught_up() -> bool:
        await ledger_metrics.refresh(bus)
        return g("trainyard_ledger_lag_events") == 0

    try:
        await eventually(caught_up, what="the ledger applied the stream")
    finally:
        stop.set()
        await consuming
        ledger.close()
    assert g("trainyard_ledger_applied_sequence") == 5 and g("trainyard_ledger_lag_seconds") == 0

    async with harness(bus, store) as h:
        admission = AdmissionMetrics()
        projections = ProjectionMetrics(admission.registry, [h.jobs, h.nodes])
        await h.settle()
        await projections.refresh(bus)
    value = admission.registry.get_sample_value
    assert value("trainyard_projection_lag_events", {"stream": "JOBS"}) == 0
    assert value("trainyard_projection_rebuilds_total", {"stream": "JOBS"}) == 0


async def test_the_gateway_exports_dead_letters_by_stream(bus: Bus, store: Store, callers: Callers) -> None:
    await bus.publish_raw(subjects.deadletter("INTAKE"), b"x", {"Trainyard-Reason": "bad", "Nats-Msg-Id": "d1"})
    await bus.publish_raw(subjects.deadletter("INTAKE"), b"y", {"Trainyard-Reason": "bad", "Nats-Msg-Id": "d2"})
    metrics = GatewayMetrics(deadletters=lambda: dlq.counts(bus))
    app = create_app(
        JobOperations(bus, store),
        store,
        callers.authenticator,
        metrics=metrics,
        routers=[dlq_api.build_router(bus, store, Settings())],
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as c:
        text = (await c.get("/metrics", headers=callers.headers("operator"))).text
    assert 'trainyard_deadletters{stream="INTAKE"} 2.0' in text
    assert 'trainyard_deadletters{stream="JOBS"} 0.0' in text
