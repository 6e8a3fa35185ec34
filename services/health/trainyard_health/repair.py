"""The repair loop: finish drains, run the health checks health asked for,
and keep the fleet gauges current.

Checks and GPU resets are requests to the node's agent
(``trainyard.agent.<cluster>.<node>.control``); the emulator answers them for
emulated nodes.  A check nobody answers stays wanted and is asked again on the
next tick.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

from trainyard.agent import control
from trainyard.core.health import ChecksFailed, ChecksPassed, DrainComplete
from trainyard.domain.node import NodeState
from trainyard.store import views
from trainyard_health.agents import ask_agent
from trainyard_health.monitor import ACTIVE, Monitor

log = logging.getLogger(__name__)


class RepairLoop:
    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor

    async def run_once(self) -> None:
        m = self.monitor
        infos, states = await m.fleet()
        records = await m.records.load_all(states)
        m.metrics.set_node_states(dict(Counter(r.state.value for r in records.values())))
        # 1. Draining nodes with no active run left go to repair.
        for node_id, record in records.items():
            if record.state != NodeState.DRAINING or node_id not in infos:
                continue
            jobs = await views.get_jobs(m.store, await views.jobs_on_node(m.store, node_id), fields=())
            if not any(j.status in ACTIVE for j in jobs):
                await m.on_command(DrainComplete(node_id=node_id))
                continue
            # A run placed just before the node left service is evacuated too
            # (each run is failed once: the message id is derived from it).
            fatal = bool(record.incidents) and record.incidents[-1] == record.since
            reason = "node_failure" if fatal else "preempted"
            await m.fail_runs(node_id, reason, f"node {node_id} is draining: {record.reason}")
        # 2. Checks health asked for.
        for node_id, reason in (await m.records.wanted_checks()).items():
            info = infos.get(node_id)
            if info is None:
                await m.records.checks_done(node_id)
                continue
            reply = await ask_agent(
                m.bus, info, control.ControlRequest(op="check", node_id=node_id, by="service:health")
            )
            if reply is None:
                log.info("no agent answered the checks for %s (%s); asking again", node_id, reason)
                continue
            await m.records.checks_done(node_id)
            if reply.ok and reply.details.get("passed") == "true":
                await m.on_command(ChecksPassed(node_id=node_id, checks=("gpu-readings",)))
            else:
                await m.on_command(ChecksFailed(node_id=node_id, reason=reply.message))

    async def run(self, stop: asyncio.Event, interval_s: float = 0.5) -> None:
        while not stop.is_set():
            try:
                await self.run_once()
            except Exception as err:  # noqa: BLE001 - infrastructure; try again next tick
                log.warning("repair loop failed: %r", err)
            try:
                await asyncio.wait_for(stop.wait(), interval_s)
            except TimeoutError:
                pass
