"""The kill sequence that made health declare a fleet lost: the nodes' host
(the emulator) stalls, nats-server is killed a little later and restarts,
then the nodes come back one by one.  Against a real nats-server that is
SIGKILLed and restarted: no node is declared lost, no run fails, no page."""

from __future__ import annotations

import asyncio
import time

import nats.errors
from health_fixtures import CLUSTER, harness
from test_health_liveness import NODES, TIMEOUT, Service, _of

from trainyard.bus import Bus
from trainyard.events import NodeLost, RunFailed, encode, subjects
from trainyard.events.nodes import NodeHeartbeat
from trainyard.local.servers import Server
from trainyard.local.supervisor import restart_server
from trainyard.store import Store
from trainyard.testing.waiting import eventually
from trainyard_health.liveness import liveness_loop


class Host:
    """The emulator: heartbeats every 0.1 s for the nodes it runs (``up``);
    a publish that fails while NATS is down is dropped, as the agent's is."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.up: set[str] = set(NODES)
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while not self.stop.is_set():
            try:
                for node in sorted(self.up):
                    beat = NodeHeartbeat(at=time.time(), node_id=node, cluster=CLUSTER, boot_id="b1")
                    await self.bus.nc.publish(subjects.telemetry(CLUSTER, node), encode(beat))
                await self.bus.nc.flush(timeout=1)
            except (nats.errors.Error, OSError, TimeoutError):
                pass  # the bus is down: these heartbeats are lost
            try:
                await asyncio.wait_for(self.stop.wait(), 0.1)
            except TimeoutError:
                pass

    async def close(self) -> None:
        self.stop.set()
        await self.task


async def pause(seconds: float) -> None:
    """Let the sequence's time pass (the scenario is a timing: nothing to await)."""
    await asyncio.sleep(seconds)


async def test_the_nodes_host_and_nats_restarting_together_declare_no_node_lost_and_fail_no_run(
    bus: Bus, store: Store, nats_server: Server
) -> None:
    async with harness(bus, store) as h:
        service, host = Service(h), Host(bus)
        stop = asyncio.Event()
        checking = asyncio.create_task(liveness_loop(service.check, stop, interval_s=0.1))
        try:
            runs = [await h.run_job(f"job-{node}", [node]) for node in NODES]
            assert (await service.judged()).lost == ()

            # The emulator stalls (SIGSTOP): every node falls silent at once ...
            host.up = set()
            await pause(0.8 * TIMEOUT)
            # ... nats-server is killed (SIGKILL) and restarted by the supervisor ...
            nats_server.kill()
            await pause(0.5 * TIMEOUT)
            restart_server(nats_server)
            # ... and the emulator, killed too, comes back with its nodes one by one
            # (within the timeout of each other), the last one well past the
            # heartbeat timeout after the stall began.
            for node in NODES:
                host.up = host.up | {node}
                await pause(0.08 * TIMEOUT)

            # Every node heartbeats again; a judged verdict after that loses nobody.
            async def judged_after_return() -> bool:
                verdict = await service.check.run_once()
                return verdict.judged and verdict.lost == ()

            await eventually(judged_after_return, what="a judged verdict with every node back")
            await pause(TIMEOUT)  # and stays so for a timeout more
        finally:
            stop.set()
            await checking
            await host.close()
            await service.close()

        assert _of(await h.node_events(), NodeLost) == []
        assert _of(await h.job_events(), RunFailed) == []
        assert [await h.state(n) for n in NODES] == ["healthy"] * len(NODES)
        assert h.monitor.metrics.alerts.labels("page")._value.get() == 0
        assert len(runs) == len(NODES)
