"""Liveness against real NATS and Redis: a stalled health service blames
nobody, a lost node that heartbeats again comes back (and the false alarm is
not held against it), an old boot's heartbeats change nothing, and health's
run failures are fenced by the job's last sequence."""

from __future__ import annotations

import asyncio
import time

from health_fixtures import CLUSTER, fleet, harness

from trainyard.agent import control
from trainyard.bus import ConsumerSpec, run_consumer
from trainyard.core.health import HealthPolicy
from trainyard.events import JobAdmitted, NodeLost, NodeRegistered, RunFailed, RunSucceeded, encode, subjects
from trainyard.events.nodes import NodeHeartbeat, NodeStateChanged
from trainyard.store import views
from trainyard.testing.publish import publish_event
from trainyard_health.fencing import publish_failures
from trainyard_health.handlers import NodeEventsHandler, TelemetryHandler
from trainyard_health.liveness import LivenessCheck
from trainyard_health.repair import RepairLoop

TIMEOUT = 2.0  # heartbeat timeout of these tests
DURABLE = "t-heartbeats"
NODES = [f"n{i}" for i in range(8)]


class Fleet:
    """Heartbeats from the test's nodes, every 0.1 s, until stopped; ``boots`` says which boots beat."""

    def __init__(self, bus) -> None:  # type: ignore[no-untyped-def]
        self.bus = bus
        self.boots: dict[str, set[str]] = {n: {"b1"} for n in NODES}
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while not self.stop.is_set():
            for node, boots in self.boots.items():
                for boot in sorted(boots):
                    beat = NodeHeartbeat(at=time.time(), node_id=node, cluster=CLUSTER, boot_id=boot)
                    await self.bus.nc.publish(subjects.telemetry(CLUSTER, node), encode(beat))
            await self.bus.nc.flush()
            try:
                await asyncio.wait_for(self.stop.wait(), 0.1)
            except TimeoutError:
                pass

    async def close(self) -> None:
        self.stop.set()
        await self.task


class Service:
    """Health's consumers and repair loop; the heartbeat consumer can be paused (a stalled process)."""

    def __init__(self, h) -> None:  # type: ignore[no-untyped-def]
        self.h = h
        self.stop = asyncio.Event()
        nodes = ConsumerSpec(stream="NODES", durable="t-nodes", filter_subject=subjects.NODES_ALL)
        self.tasks = [
            asyncio.create_task(run_consumer(h.bus, nodes, NodeEventsHandler(h.monitor, time.time), self.stop)),
            asyncio.create_task(RepairLoop(h.monitor).run(self.stop, interval_s=0.1)),
        ]
        self.telemetry_stop = asyncio.Event()
        self.telemetry: asyncio.Task | None = None
        self.check = LivenessCheck(h.bus, h.store, h.monitor, TIMEOUT, time.time, durable=DURABLE, catch_up_wait_s=0.5)
        self.resume()

    def resume(self) -> None:
        self.telemetry_stop = asyncio.Event()
        spec = ConsumerSpec(stream="TELEMETRY", durable=DURABLE, filter_subject=subjects.TELEMETRY_ALL)
        handler = TelemetryHandler(self.h.monitor, time.time)
        self.telemetry = asyncio.create_task(run_consumer(self.h.bus, spec, handler, self.telemetry_stop))

    async def pause(self) -> None:
        self.telemetry_stop.set()
        assert self.telemetry is not None
        await self.telemetry

    async def judged(self, timeout: float = 30.0):  # type: ignore[no-untyped-def]
        """Run the liveness check until it judges (its view caught up); returns that verdict."""
        deadline = time.monotonic() + timeout
        while True:
            verdict = await self.check.run_once()
            if verdict.judged or time.monotonic() > deadline:
                assert verdict.judged, verdict.reason
                return verdict

    async def close(self) -> None:
        self.stop.set()
        self.telemetry_stop.set()
        await asyncio.gather(*self.tasks, *([self.telemetry] if self.telemetry else []))


async def answer_checks(bus) -> object:  # type: ignore[no-untyped-def]
    """Node agents that pass every health check."""

    async def reply(msg) -> None:  # type: ignore[no-untyped-def]
        answer = control.ControlReply(ok=True, message="ok", details={"passed": "true"})
        await msg.respond(control.encode(answer))

    return await bus.nc.subscribe(control.agent_control_wildcard(CLUSTER), cb=reply)


async def until(check, timeout: float = 30.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value or time.monotonic() > deadline:
            return value
        await asyncio.sleep(0.05)


async def stalled_for(seconds: float) -> None:
    """Let the fleet's heartbeats pile up for this long (health's consumer is paused meanwhile)."""
    start = time.monotonic()
    await until(lambda: _elapsed(start, seconds), timeout=seconds * 10)


async def _elapsed(start: float, seconds: float) -> bool:
    return time.monotonic() - start >= seconds


def _of(events: list, kind: type, node: str | None = None) -> list:  # type: ignore[type-arg]
    return [e for e in events if isinstance(e, kind) and (node is None or getattr(e, "node_id", None) == node)]


async def test_a_stalled_health_service_declares_no_node_lost_and_fails_no_run(bus, store) -> None:
    async with harness(bus, store) as h:
        service, beats = Service(h), Fleet(bus)
        try:
            await h.run_job("gang", ["n0", "n1"])
            assert (await service.judged()).lost == ()
            # Health stalls for well over the timeout while the fleet keeps heartbeating.
            await service.pause()
            await stalled_for(2.5 * TIMEOUT)
            stalled = await service.check.run_once()
            assert not stalled.judged and stalled.reason == "heartbeat backlog not read yet"
            service.resume()
            verdict = await service.judged()
            assert verdict.lost == ()
            assert _of(await h.node_events(), NodeLost) == []
            assert _of(await h.job_events(), RunFailed) == []
            assert [await h.state(n) for n in NODES] == ["healthy"] * len(NODES)
        finally:
            await beats.close()
            await service.close()


async def test_a_lost_node_that_heartbeats_again_comes_back_and_the_false_alarm_is_not_held_against_it(
    bus, store
) -> None:
    policy = HealthPolicy(lemon_incidents=1, blast_radius_max_share=1.0)  # one counted loss would keep it in repair
    async with harness(bus, store, policy) as h:
        agents = await answer_checks(bus)
        service, beats = Service(h), Fleet(bus)
        try:
            run_id = await h.run_job("j", ["n3"])
            beats.boots["n3"] = set()  # n3 falls silent
            assert await until(lambda: _lost_after_check(service, h, "n3"))
            assert await until(lambda: _failed_runs(h, [(run_id, "node_failure")]))
            beats.boots["n3"] = {"b1"}  # ... and heartbeats again with the same boot
            assert await until(lambda: _history(h, "n3", ["lost", "repair", "healthy"]))
            changes = [(e.previous, e.state) for e in _of(await h.node_events(), NodeStateChanged, "n3")]
            assert changes == [("healthy", "lost"), ("lost", "repair"), ("repair", "healthy")]
            record = await h.monitor.records.load("n3")
            assert record.incidents == () and not record.lemon
        finally:
            await beats.close()
            await service.close()
            await agents.unsubscribe()


async def test_an_old_boots_heartbeats_neither_keep_a_restarted_node_alive_nor_bring_it_back(bus, store) -> None:
    async with harness(bus, store, HealthPolicy(blast_radius_max_share=1.0)) as h:
        service, beats = Service(h), Fleet(bus)
        try:
            # n5's agent restarts as boot b2; the old process (b1) keeps heartbeating for a while.
            ack = await bus.publish(
                subjects.node(CLUSTER, "n5"),
                NodeRegistered(at=time.time(), node=fleet()[5], boot_id="b2"),
                msg_id="reg:n5:b2",
            )
            await h.nodes_projector.wait_for(ack.seq)
            beats.boots["n5"] = {"b1", "b2"}
            for _ in range(3):
                assert (await service.judged()).lost == ()
            beats.boots["n5"] = {"b1"}  # the new boot falls silent; only the old one beats
            assert await until(lambda: _lost_after_check(service, h, "n5"))
            lost = _of(await h.node_events(), NodeLost, "n5")
            assert [e.boot_id for e in lost] == ["b2"]
            for _ in range(3):  # rounds that have read the old boot's newer heartbeats
                await service.judged()
            assert await h.state("n5") == "lost"
            assert [e.state for e in _of(await h.node_events(), NodeStateChanged, "n5")] == ["lost"]
        finally:
            await beats.close()
            await service.close()


async def test_a_run_failure_for_a_run_that_already_succeeded_is_refused_by_the_fence(bus, store) -> None:
    async with harness(bus, store) as h:
        run_id = await h.run_job("done", ["n2"])
        stale = await views.get_jobs(store, ["done"])  # read while the run was running
        assert stale[0].status == "running"
        ack = await publish_event(
            bus, RunSucceeded(at=time.time(), job_id="done", tenant="acme", run_id=run_id), msg_id=f"{run_id}:succeeded"
        )
        # A failure decided on the stale view is refused by NATS; nothing is published.
        failed, refused = await publish_failures(bus, time.time, stale, "n2", "node_failure", "node n2 was lost")
        assert (failed, refused) == (0, ["done"])
        # Health's own path waits for the projection and leaves the finished run alone.
        assert await h.monitor.fail_runs("n2", "node_failure", "node n2 was lost") == 0
        await h.jobs_projector.wait_for(ack.seq)
        assert _of(await h.job_events(), RunFailed) == []
        job = await views.get_job(store, "done")
        assert job is not None and job.status == "succeeded"


async def test_a_run_failure_never_fails_a_newer_run_of_the_job(bus, store) -> None:
    async with harness(bus, store) as h:
        await h.run_job("again", ["n2"])
        stale = await views.get_jobs(store, ["again"])
        # The job starts a newer run (r1 failed for another reason, r2 admitted) before health publishes.
        first = RunFailed(
            at=time.time(),
            job_id="again",
            tenant="acme",
            run_id="again-r1",
            reason="workload_error",
            message="exit 1",
            node_id="n2",
        )
        await publish_event(bus, first, msg_id="again-r1:failed")
        ack = await publish_event(
            bus,
            JobAdmitted(at=time.time(), job_id="again", tenant="acme", run_id="again-r2", attempt=2),
            msg_id="again:admit:2",
        )
        await h.jobs_projector.wait_for(ack.seq)
        failed, refused = await publish_failures(bus, time.time, stale, "n2", "node_failure", "node n2 was lost")
        assert (failed, refused) == (0, ["again"])
        assert await h.monitor.fail_runs("n2", "node_failure", "node n2 was lost") == 0
        assert [e.run_id for e in _of(await h.job_events(), RunFailed)] == ["again-r1"]


async def _lost_after_check(service: Service, h, node: str) -> bool:  # type: ignore[no-untyped-def]
    await service.check.run_once()
    return await h.state(node) == "lost"


async def _failed_runs(h, expected: list[tuple[str, str]]) -> bool:  # type: ignore[no-untyped-def]
    return [(e.run_id, e.reason) for e in _of(await h.job_events(), RunFailed)] == expected


async def _history(h, node: str, states: list[str]) -> bool:  # type: ignore[no-untyped-def]
    record = await h.monitor.records.load(node)
    return [e.to_state.value for e in record.history] == states
