"""Composition root of the health service."""

from __future__ import annotations

import asyncio
import logging
import time

from trainyard.bus import ConsumerSpec, run_consumer
from trainyard.events import subjects
from trainyard.runtime import Runtime, run_tasks, serve
from trainyard.store import Projector
from trainyard_health.handlers import HeartbeatHandler, LivenessCheck

log = logging.getLogger(__name__)


async def liveness_loop(rt: Runtime, check: LivenessCheck, nodes: Projector) -> None:
    await nodes.wait_for(await rt.store.last_seq("nodes"))
    await check.grace()
    while not rt.stop.is_set():
        try:
            await check.run_once()
        except Exception as err:  # noqa: BLE001 - infrastructure; try again next tick
            log.warning("liveness check failed: %r", err)
        try:
            await asyncio.wait_for(rt.stop.wait(), rt.settings.heartbeat_interval_s / 2)
        except asyncio.TimeoutError:
            pass


async def main(rt: Runtime) -> None:
    nodes = Projector(rt.bus, rt.store, "NODES")
    heartbeats = ConsumerSpec(
        stream="TELEMETRY", durable="health-heartbeats", filter_subject=subjects.TELEMETRY_ALL, ack_wait_s=10.0
    )
    check = LivenessCheck(rt.bus, rt.store, rt.settings.heartbeat_timeout_s, time.time)
    await run_tasks(
        rt.stop,
        nodes.run(rt.stop),
        run_consumer(rt.bus, heartbeats, HeartbeatHandler(rt.store, time.time), rt.stop),
        liveness_loop(rt, check, nodes),
    )


def run() -> None:
    serve("health", main)
