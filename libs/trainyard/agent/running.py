"""A node agent that executes runs: :class:`~trainyard.agent.node.NodeAgent`
(registration, heartbeats, telemetry, XIDs, control requests) with an
:class:`~trainyard.agent.executor.Executor`.

It reads only its own orders, through the durable pull consumer
``agent-<node_id>`` on the WORK stream filtered to
``trainyard.work.<cluster>.<node_id>.orders``, and writes only its own
reports, on ``trainyard.work.<cluster>.<node_id>.reports``.  It reads no JOBS
event and uses no Redis: its cost does not grow with the cluster.  Orders are
applied idempotently (a StartRun whose run directory exists starts nothing),
so a redelivered order is harmless; an order that does not decode, or that
names another node, is dead-lettered.  Heartbeats carry the runs it executes
now; the ``logs`` control request reads a rank's log file (see
:mod:`trainyard.agent.control`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import signal
import socket
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from nats.aio.msg import Msg

from trainyard.agent import control, runlogs
from trainyard.agent.executor import Executor
from trainyard.agent.node import NodeAgent
from trainyard.agent.orders import check_order
from trainyard.agent.outbox import Outbox
from trainyard.bus import (
    Bus,
    ConsumerSpec,
    Delivery,
    Outcome,
    PoisonMessage,
    Subscription,
    ensure_streams,
    run_consumer,
)
from trainyard.domain.node import NodeInfo
from trainyard.events import subjects
from trainyard.events.work import SignalRun, StartRun, StopRun, WorkOrder, decode_work
from trainyard.gpu.nvml import GpuBackend
from trainyard.redaction import redact
from trainyard.settings import Settings

log = logging.getLogger(__name__)


class Orders(Subscription[WorkOrder]):
    """The orders of one node, applied by its executor."""

    def __init__(self, executor: Executor, node_id: str) -> None:
        self.executor = executor
        self.node_id = node_id

    def decode(self, subject: str, data: bytes) -> WorkOrder:
        message = decode_work(data)
        if not isinstance(message, (StartRun, SignalRun, StopRun)):
            raise PoisonMessage(f"a {type(message).__name__} is a report, not an order")
        if message.node_id != self.node_id:
            raise PoisonMessage(f"an order for node {message.node_id!r} on the orders of {self.node_id!r}")
        try:
            check_order(message)
        except ValueError as err:
            raise PoisonMessage(f"{type(message).__name__} of run {message.run_id!r}: {err}") from None
        return message

    async def handle(self, batch: Sequence[Delivery[WorkOrder]]) -> list[Outcome]:
        for delivery in batch:
            await self.executor.apply(delivery.event)
        return [Outcome.done()] * len(batch)


def order_consumer(node: NodeInfo) -> ConsumerSpec:
    return ConsumerSpec(
        stream="WORK",
        durable=f"agent-{subjects.token(node.node_id)}",
        filter_subject=subjects.work_orders(node.cluster, node.node_id),
        batch=64,
        ack_wait_s=30.0,
    )


class RunningAgent(NodeAgent):
    def __init__(
        self, bus: Bus, node: NodeInfo, backend: GpuBackend, executor: Executor, outbox: Outbox, **kw: Any
    ) -> None:
        super().__init__(bus, node, backend, **kw)
        self.executor = executor
        self.outbox = outbox
        self.running_runs = executor.running_runs
        if not executor.boot_id:
            executor.boot_id = self.boot_id

    @classmethod
    def build(
        cls,
        bus: Bus,
        node: NodeInfo,
        backend: GpuBackend,
        state_dir: str | Path,
        *,
        executor_options: dict[str, Any] | None = None,
        **agent_options: Any,
    ) -> RunningAgent:
        """An agent whose executor keeps its state under ``state_dir``;
        ``executor_options`` go to :class:`Executor` (``run_as``,
        ``container_runtime``, ``log_max_bytes``, ``poll_s``), the rest to
        :class:`NodeAgent` (``heartbeat_interval_s``, ...)."""
        outbox = Outbox(bus, subjects.work_reports(node.cluster, node.node_id))
        executor = Executor(Path(state_dir), node.node_id, outbox, **(executor_options or {}))
        return cls(bus, node, backend, executor, outbox, **agent_options)

    def answer(self, request: control.ControlRequest) -> control.ControlReply:
        if request.op != "logs":
            return super().answer(request)
        try:
            data, size = runlogs.read(
                self.executor.state_dir, request.job_id, request.attempt, request.rank, request.offset, request.limit
            )
        except ValueError as err:
            return control.ControlReply(ok=False, message=f"bad logs request: {err}")
        except FileNotFoundError:
            return control.ControlReply(
                ok=False,
                message=f"no log of rank {request.rank} of attempt {request.attempt} of job {request.job_id!r} "
                f"on {self.node.node_id}",
            )
        start = max(0, size + request.offset) if request.offset < 0 else min(request.offset, size)
        details = {"offset": str(start), "next_offset": str(start + len(data)), "size": str(size)}
        return control.ControlReply(ok=True, message=f"{len(data)} bytes", details=details, data=data)

    async def _on_logs(self, msg: Msg) -> None:
        """The logs subject answers ``logs`` requests only (the gateway's way in)."""
        request = control.decode_request(msg.data)
        if isinstance(request, control.ControlRequest) and request.op != "logs":
            request = control.ControlReply(ok=False, message="only logs requests are answered here")
        await self._on_request(msg, request)

    async def run(self, stop: asyncio.Event) -> None:
        """Reattach to the runs recorded on disk, then register, execute and report until ``stop``.
        The processes keep running when the agent stops; the next start reattaches."""
        await self.executor.reattach()
        orders = Orders(self.executor, self.node.node_id)
        logs_sub = await self.bus.nc.subscribe(
            control.agent_logs_subject(self.node.cluster, self.node.node_id), cb=self._on_logs
        )

        async def consume() -> None:
            delay = 0.2
            while not stop.is_set():
                try:
                    await run_consumer(self.bus, order_consumer(self.node), orders, stop)
                    return
                except Exception as err:  # noqa: BLE001 - the consumer could not be made: NATS away, no stream yet
                    log.warning(
                        "cannot read the orders of %s (%r); trying again in %.1fs", self.node.node_id, err, delay
                    )
                    try:
                        await asyncio.wait_for(stop.wait(), delay)
                    except TimeoutError:
                        pass
                    delay = min(delay * 2, 5.0)

        try:
            await asyncio.gather(super().run(stop), self.outbox.run(stop), consume())
        finally:
            await logs_sub.unsubscribe()
            await self.executor.close()


def default_address(nats_url: str) -> str:
    """Where this node's processes are reached: 127.0.0.1 when the bus is on
    this machine's loopback (a local stack), else the address of the
    interface that reaches the bus (no packet is sent to find it)."""
    host = urlsplit(nats_url.split(",")[0].strip()).hostname or "127.0.0.1"
    try:
        if host == "localhost" or ipaddress.ip_address(host).is_loopback:
            return "127.0.0.1"
    except ValueError:
        pass  # a host name
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, 4222))
            return str(s.getsockname()[0])
    except OSError:
        return socket.gethostbyname(socket.gethostname())


def serve_agent(make: Callable[[Bus, Settings], Awaitable[NodeAgent]]) -> None:
    """Run the agent ``make`` builds until SIGTERM or SIGINT: NATS only (an
    agent has no Redis), waiting for the bus while it is away."""
    from trainyard.observability import logs
    from trainyard.runtime import nats_options, run_loop
    from trainyard.settings import ConfigurationError, load_settings

    try:
        settings = load_settings()
        logs.configure("agent", settings.log_level, settings.log_format)
    except (ConfigurationError, ValueError) as err:
        raise SystemExit(f"trainyard-agent: {err}") from err

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        delay = 0.2
        while True:
            try:
                bus = await Bus.connect(
                    settings.nats_url,
                    name="trainyard-agent",
                    group_commit=settings.nats_group_commit,
                    **nats_options(settings),
                )
                break
            except Exception as err:  # noqa: BLE001 - NATS not up yet: wait for it
                log.warning("NATS at %s is not reachable (%r); trying again in %.1fs", settings.nats_url, err, delay)
                try:
                    await asyncio.wait_for(stop.wait(), delay)
                    return
                except TimeoutError:
                    delay = min(delay * 2, 5.0)
        if not settings.nats_user:  # an open bus (a local stack): make what may be missing
            try:
                await ensure_streams(bus.js, replicas=settings.stream_replicas)
            except Exception as err:  # noqa: BLE001 - the services make them too
                log.warning("could not make or check the streams (%r); the services make them", err)
        try:
            agent = await make(bus, settings)
            # "agent-<node> started (" is what trainyard up waits for (trainyard.local.logs.READY_MARKER).
            log.info("agent-%s started (nats %s)", agent.node.node_id, redact(settings.nats_url))
            await agent.run(stop)
        finally:
            await bus.close()
            log.info("agent stopped")

    run_loop(settings, main())
