"""One node's agent: heartbeats, periodic GPU telemetry, XIDs at once, checks.

``NodeAgent`` is used two ways: by ``trainyard agent`` on a real node (NVML
backend, its own XID thread, its own control subscription), and by the
emulator, which drives one agent per emulated node over a fake backend and
publishes injected XIDs straight away.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable

from nats.aio.msg import Msg

from trainyard.agent import control
from trainyard.agent.checks import CheckReport, run_checks
from trainyard.bus import Bus
from trainyard.domain.node import NodeInfo
from trainyard.events import NodeHeartbeat, NodeRegistered, encode, subjects
from trainyard.events.nodes import GpuTelemetry, XidObserved
from trainyard.gpu.nvml import GpuBackend, NodeSample, XidEvent, sample_node

log = logging.getLogger(__name__)


class NodeAgent:
    def __init__(
        self,
        bus: Bus,
        node: NodeInfo,
        backend: GpuBackend,
        *,
        clock: Callable[[], float] = time.time,
        boot_id: str | None = None,
        heartbeat_interval_s: float = 1.0,
        telemetry_interval_s: float = 5.0,
    ) -> None:
        self.bus = bus
        self.node = node
        self.backend = backend
        self.clock = clock
        self.boot_id = boot_id or uuid.uuid4().hex[:12]
        self.heartbeat_interval_s = heartbeat_interval_s
        self.telemetry_interval_s = telemetry_interval_s
        self.silent = False  # fault injection: stop heartbeats and telemetry
        self.last_sample: NodeSample | None = None  # the last sample published
        self._xid_seq = 0  # numbers XID batches of this boot, for message ids
        self.running_runs: Callable[[], list[str]] = list  # the runs this node executes now (heartbeats)

    @property
    def subject(self) -> str:
        return subjects.telemetry(self.node.cluster, self.node.node_id)

    # --- what the agent publishes ---

    async def register(self) -> None:
        registered = NodeRegistered(at=self.clock(), node=self.node, boot_id=self.boot_id)
        await self.bus.publish(
            subjects.node(self.node.cluster, self.node.node_id),
            registered,
            msg_id=f"register:{self.node.node_id}:{self.boot_id}",
        )

    async def heartbeat(self) -> None:
        if self.silent:
            return
        beat = NodeHeartbeat(
            at=self.clock(),
            node_id=self.node.node_id,
            cluster=self.node.cluster,
            boot_id=self.boot_id,
            running_runs=self.running_runs(),
        )
        await self.bus.nc.publish(self.subject, encode(beat))

    async def publish_sample(self) -> NodeSample | None:
        """Read every GPU and publish the reading (fire and forget: the next one follows)."""
        if self.silent:
            return None
        sample = sample_node(self.backend, self.node.node_id, self.clock())
        message = GpuTelemetry(
            at=sample.at, node_id=self.node.node_id, cluster=self.node.cluster, boot_id=self.boot_id, sample=sample
        )
        await self.bus.nc.publish(self.subject, encode(message))
        self.last_sample = sample
        return sample

    async def publish_xids(self, events: list[XidEvent]) -> None:
        """XIDs are published with an acknowledgement and a message id: they must arrive."""
        if not events or self.silent:
            return
        self._xid_seq += 1
        message = XidObserved(
            at=self.clock(), node_id=self.node.node_id, cluster=self.node.cluster, boot_id=self.boot_id, events=events
        )
        await self.bus.publish(self.subject, message, msg_id=f"xid:{self.node.node_id}:{self.boot_id}:{self._xid_seq}")

    def check(self) -> CheckReport:
        return run_checks(self.backend, self.node.node_id, self.clock(), self.node.gpus)

    # --- control requests ---

    def answer(self, request: control.ControlRequest) -> control.ControlReply:
        """Agent operations; the emulator adds fault injection on top."""
        if request.op == "check":
            report = self.check()
            text = "checks passed" if report.passed else "; ".join(report.problems)
            return control.ControlReply(ok=True, message=text, details={"passed": str(report.passed).lower()})
        if request.op == "reset_gpu":
            reset = getattr(self.backend, "reset_gpu", None)
            if reset is None:
                return control.ControlReply(
                    ok=False, message="this backend cannot reset GPUs; reset by hand (nvidia-smi -r)"
                )
            reset(request.gpu)
            return control.ControlReply(ok=True, message=f"GPU {request.gpu} of {self.node.node_id} reset")
        if request.op == "probe":
            probe = getattr(self.backend, "probe", None)
            if probe is None:
                return control.ControlReply(ok=False, message="this backend has no probe")
            return control.ControlReply(ok=True, message="probe report", details=probe(request.gpu))
        return control.ControlReply(ok=False, message=f"an agent does not do {request.op!r}")

    async def _on_control(self, msg: Msg) -> None:
        await self._on_request(msg, control.decode_request(msg.data))

    async def _on_request(self, msg: Msg, request: control.ControlRequest | control.ControlReply) -> None:
        """Answer ``request`` (a reply already: a request that could not be read)."""
        if isinstance(request, control.ControlRequest):
            try:
                reply = await asyncio.to_thread(self.answer, request)
            except Exception as err:  # noqa: BLE001 - answered, never raised into NATS
                reply = control.ControlReply(ok=False, message=f"{request.op} failed: {err}")
        else:
            reply = request
        await msg.respond(control.encode(reply))

    # --- loops, for a real node ---

    async def _every(self, interval: float, stop: asyncio.Event, step: Callable) -> None:  # type: ignore[type-arg]
        while not stop.is_set():
            try:
                await step()
            except Exception as err:  # noqa: BLE001 - NATS away or a read failed: next tick
                log.warning("%s: %r", getattr(step, "__name__", "step"), err)
            try:
                await asyncio.wait_for(stop.wait(), interval)
            except TimeoutError:
                pass

    async def xid_loop(self, stop: asyncio.Event, wait_s: float = 1.0) -> None:
        """Wait for XIDs in a thread (NVML blocks) and publish each batch at once."""
        while not stop.is_set():
            try:
                events = await asyncio.to_thread(self.backend.wait_xid, wait_s)
            except Exception as err:  # noqa: BLE001 - e.g. GPU lost: the next sample shows it
                log.warning("waiting for XIDs failed: %r", err)
                await asyncio.sleep(wait_s)
                continue
            for attempt in range(20):
                try:
                    await self.publish_xids(events)
                    break
                except Exception as err:  # noqa: BLE001 - keep the XIDs until NATS takes them
                    log.warning("publishing XIDs failed (%r); retrying", err)
                    await asyncio.sleep(min(0.2 * (attempt + 1), 2.0))

    async def _register_until_done(self, stop: asyncio.Event) -> None:
        """Register, retrying while NATS or the NODES stream is not there yet."""
        delay = 0.2
        while not stop.is_set():
            try:
                await self.register()
                return
            except Exception as err:  # noqa: BLE001 - the services may not have made the streams yet
                log.warning("registering %s failed (%r); trying again in %.1fs", self.node.node_id, err, delay)
            try:
                await asyncio.wait_for(stop.wait(), delay)
            except TimeoutError:
                delay = min(delay * 2, 5.0)

    async def run(self, stop: asyncio.Event) -> None:
        """Register, answer control requests, and report until ``stop``."""
        pre = self.check()
        if not pre.passed:
            log.warning("start-up checks failed: %s", "; ".join(pre.problems))
        await self._register_until_done(stop)
        sub = await self.bus.nc.subscribe(
            control.agent_control_subject(self.node.cluster, self.node.node_id), cb=self._on_control
        )
        try:
            await asyncio.gather(
                self._every(self.heartbeat_interval_s, stop, self.heartbeat),
                self._every(self.telemetry_interval_s, stop, self.publish_sample),
                self.xid_loop(stop),
            )
        finally:
            await sub.unsubscribe()
            self.backend.close()
