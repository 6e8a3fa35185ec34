"""The health service against real NATS and Redis: telemetry and XIDs in,
node state changes, run failures, alerts and audit records out."""

from __future__ import annotations

import asyncio
import time

import pytest
from health_fixtures import CLUSTER, harness

from trainyard.bus import ConsumerSpec, run_consumer
from trainyard.core.health import HealthPolicy
from trainyard.events import RunFailed, encode, subjects
from trainyard.events.nodes import GpuTelemetry, NodeStateChanged, XidObserved
from trainyard.gpu import FakeGpuBackend, XidEvent, sample_node
from trainyard.testing.waiting import eventually
from trainyard_health.handlers import NodeEventsHandler, TelemetryHandler
from trainyard_health.repair import RepairLoop


async def consume(h, stop: asyncio.Event) -> list[asyncio.Task]:  # type: ignore[no-untyped-def]
    telemetry = ConsumerSpec(stream="TELEMETRY", durable="t-health", filter_subject=subjects.TELEMETRY_ALL)
    nodes = ConsumerSpec(stream="NODES", durable="t-nodes", filter_subject=subjects.NODES_ALL)
    return [
        asyncio.create_task(run_consumer(h.bus, telemetry, TelemetryHandler(h.monitor, time.time), stop)),
        asyncio.create_task(run_consumer(h.bus, nodes, NodeEventsHandler(h.monitor, time.time), stop)),
        asyncio.create_task(RepairLoop(h.monitor).run(stop, interval_s=0.1)),
    ]


async def xid(h, node: str, code: int, gpu: int = 0, msg_id: str | None = None) -> None:  # type: ignore[no-untyped-def]
    event = XidObserved(
        at=time.time(),
        node_id=node,
        cluster=CLUSTER,
        boot_id="b1",
        events=[XidEvent(gpu_index=gpu, uuid=None, xid=code, at=time.time())],
    )
    await h.bus.publish(subjects.telemetry(CLUSTER, node), event, msg_id=msg_id or f"xid:{node}:{code}:{time.time()}")


@pytest.mark.parametrize(
    "code, state, fails_runs",
    [
        pytest.param(79, "repair", True, id="XID 79 (fallen off the bus) isolates the node and fails the gang's run"),
        pytest.param(48, "repair", True, id="XID 48 (double-bit ECC) isolates the node and fails its runs"),
        pytest.param(63, "suspect", False, id="XID 63 (row remap pending) makes the node suspect and keeps its runs"),
        pytest.param(43, "healthy", False, id="XID 43 (application stopped) changes nothing"),
    ],
)
async def test_an_xid_moves_the_node_as_the_catalog_says(bus, store, code, state, fails_runs) -> None:
    async with harness(bus, store) as h:
        stop = asyncio.Event()
        tasks = await consume(h, stop)
        try:
            run_id = await h.run_job("gang", ["n0", "n1", "n4", "n5"])
            await xid(h, "n1", code)

            async def settled():  # type: ignore[no-untyped-def]
                current = await h.state("n1")
                return current if current == state else None

            if state != "healthy":
                assert await eventually(settled) == state
            else:
                await asyncio.sleep(1.0)
                assert await h.state("n1") == "healthy"
            failed = [e for e in await h.job_events() if isinstance(e, RunFailed)]
            if fails_runs:
                assert [(e.run_id, e.reason, e.node_id) for e in failed] == [(run_id, "node_failure", "n1")]
                assert await h.store.redis.hget(h.store.key("capacity"), "H100") == str(7 * 8)
            else:
                assert failed == []
        finally:
            stop.set()
            await asyncio.gather(*tasks)


async def test_a_redelivered_xid_fails_each_run_once_and_changes_state_once(bus, store) -> None:
    async with harness(bus, store) as h:
        stop = asyncio.Event()
        tasks = await consume(h, stop)
        try:
            await h.run_job("a", ["n2"])
            await h.run_job("b", ["n2", "n3"], gpus_per_node=4)
            for i in range(3):  # the same XID, reported three times under different message ids
                await xid(h, "n2", 79, msg_id=f"again-{i}")
            await eventually(lambda: _in(h, "n2", "repair"))

            async def both_failed() -> bool:
                return len([e for e in await h.job_events() if isinstance(e, RunFailed)]) >= 2

            await eventually(both_failed, what="both runs on n2 failed")
            await asyncio.sleep(0.5)  # and no third failure follows from the repeated reports
            failed = sorted((e.job_id, e.reason) for e in await h.job_events() if isinstance(e, RunFailed))
            assert failed == [("a", "node_failure"), ("b", "node_failure")]
            changes = [(e.previous, e.state) for e in await h.node_events() if isinstance(e, NodeStateChanged)]
            assert changes == [("healthy", "draining"), ("draining", "repair")]
            actions = await h.audit_actions()
            assert "node.draining" in actions and "node.repair" in actions
            history = (await h.monitor.records.load("n2")).history
            assert [(e.from_state.value, e.to_state.value) for e in history] == changes
        finally:
            stop.set()
            await asyncio.gather(*tasks)


async def _in(h, node: str, state: str) -> bool:  # type: ignore[no-untyped-def]
    return await h.state(node) == state


async def test_telemetry_samples_go_through_the_rules_with_the_previous_sample(bus, store) -> None:
    async with harness(bus, store) as h:
        stop = asyncio.Event()
        tasks = await consume(h, stop)
        gpus = FakeGpuBackend(8, clock=time.time)
        try:

            async def send() -> None:
                sample = sample_node(gpus, "n3", time.time())
                message = GpuTelemetry(at=sample.at, node_id="n3", cluster=CLUSTER, boot_id="b1", sample=sample)
                await h.bus.nc.publish(subjects.telemetry(CLUSTER, "n3"), encode(message))

            await send()
            await asyncio.sleep(0.3)
            gpus.set_nvlink_down(2, [0, 1])  # links that were up in the previous sample: fatal
            await send()
            assert await eventually(lambda: _in(h, "n3", "repair"))
            record = await h.monitor.records.load("n3")
            assert record.gpus == (2,) and record.remedy is not None and record.remedy.value == "reset_gpu"
        finally:
            stop.set()
            await asyncio.gather(*tasks)


async def test_the_blast_radius_limit_alerts_instead_of_isolating_too_much_of_a_pool(bus, store) -> None:
    policy = HealthPolicy(blast_radius_max_share=0.25, rack_fault_min_nodes=10)  # 8 nodes: at most 2 out
    async with harness(bus, store, policy) as h:
        stop = asyncio.Event()
        tasks = await consume(h, stop)
        try:
            for node in ("n0", "n1", "n4"):
                await xid(h, node, 79)
                await asyncio.sleep(0.3)
            await asyncio.sleep(0.5)
            states = [await h.state(n) for n in ("n0", "n1", "n4")]
            assert states.count("healthy") == 1 and states[-1] == "healthy"
            assert h.monitor.metrics.held._value.get() >= 1
            assert any(a == "health.alert.page" for a in await h.audit_actions())
        finally:
            stop.set()
            await asyncio.gather(*tasks)


async def test_three_nodes_of_one_rack_failing_together_raise_a_rack_fault_instead(bus, store) -> None:
    async with harness(bus, store, HealthPolicy(blast_radius_max_share=1.0)) as h:
        findings = []
        from trainyard.core.health import NodeHealthRecord, evaluate_xids

        for node in ("n0", "n1", "n2"):  # rack r1
            findings += evaluate_xids(
                NodeHealthRecord(node_id=node), [XidEvent(0, None, 79, time.time())], h.monitor.policy
            )
        await h.monitor.on_findings(findings)
        assert [await h.state(n) for n in ("n0", "n1", "n2")] == ["healthy"] * 3
        assert h.monitor.metrics.rack_faults._value.get() == 1
