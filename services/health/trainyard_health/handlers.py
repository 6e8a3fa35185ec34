"""Health's handlers.

- ``TelemetryHandler`` (TELEMETRY): heartbeats, GPU samples and XIDs; samples
  and XIDs go through the rules and the monitor.
- ``NodeEventsHandler`` (NODES): registrations (a lost node that reports again
  goes to repair), ``NodeLost`` (the record follows), and operator commands.
- ``LivenessCheck``: marks silent nodes lost and fails the runs on them.

The heartbeat clock is health's own: a heartbeat counts when health receives
it, so a node with a wrong clock is judged fairly.  After a restart every
known node gets one full timeout of grace.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import msgspec
from nats.aio.msg import Msg

from trainyard.bus import Bus, PoisonMessage, PublishRequest, RetryLater
from trainyard.core.health import (
    Cordon,
    Drain,
    Finding,
    FindingKind,
    HeartbeatResumed,
    Remedy,
    Severity,
    Uncordon,
    evaluate_sample,
    evaluate_xids,
)
from trainyard.domain.node import NodeState
from trainyard.events import NodeHeartbeat, NodeLost, NodeRegistered, RunFailed, decode_node_event, subjects
from trainyard.events.nodes import CordonNode, DrainNode, GpuTelemetry, UncordonNode, XidObserved
from trainyard.store import Store
from trainyard.store import views
from trainyard_health.monitor import Monitor
from trainyard_health.records import VersionConflict

#: Operator commands older than this when health first sees them (a new
#: consumer replaying the stream) are not carried out.
COMMAND_MAX_AGE_S = 300.0

log = logging.getLogger(__name__)


class TelemetryHandler:
    """Heartbeats, samples and XIDs from agents; one batch -> one monitor decision."""

    def __init__(self, monitor: Monitor, clock: Callable[[], float]) -> None:
        self.monitor = monitor
        self.store = monitor.store
        self.clock = clock

    async def __call__(self, msgs: Sequence[Msg]) -> list[BaseException | None]:
        outcomes: list[BaseException | None] = [None] * len(msgs)
        now = self.clock()
        pipe = self.store.redis.pipeline(transaction=False)
        findings: list[Finding] = []
        records = self.monitor.records
        for i, msg in enumerate(msgs):
            try:
                event = decode_node_event(msg.data)
            except (msgspec.DecodeError, msgspec.ValidationError) as err:
                outcomes[i] = PoisonMessage(f"not a node event: {err}")
                continue
            if isinstance(event, NodeHeartbeat):
                pipe.zadd(self.store.key("hb"), {event.node_id: now})
                pipe.hset(self.store.key("hbboot"), event.node_id, event.boot_id)
            elif isinstance(event, XidObserved):
                record = await records.load(event.node_id)
                findings += evaluate_xids(record, event.events, self.monitor.policy)
                for x in event.events:
                    self.monitor.metrics.xids.labels(str(x.xid)).inc()
            elif isinstance(event, GpuTelemetry):
                if event.sample.node_id != event.node_id:
                    outcomes[i] = PoisonMessage(f"sample of {event.sample.node_id} sent as {event.node_id}")
                    continue
                record = await records.load(event.node_id)
                previous = await records.previous_sample(event.node_id)
                if previous is not None and previous.at >= event.sample.at:
                    continue  # an older reading, delivered late
                findings += evaluate_sample(record, event.sample, previous, self.monitor.policy)
                await records.keep_sample(event.sample)
        await pipe.execute()
        try:
            await self.monitor.on_findings(findings)
        except VersionConflict as err:
            raise RetryLater(f"record of {err} changed meanwhile", 0.1) from err
        return outcomes


class NodeEventsHandler:
    """Registrations, losses and operator commands from the NODES stream."""

    def __init__(self, monitor: Monitor, clock: Callable[[], float]) -> None:
        self.monitor = monitor
        self.clock = clock

    async def __call__(self, msgs: Sequence[Msg]) -> list[BaseException | None]:
        outcomes: list[BaseException | None] = [None] * len(msgs)
        for i, msg in enumerate(msgs):
            try:
                event = decode_node_event(msg.data)
            except (msgspec.DecodeError, msgspec.ValidationError) as err:
                outcomes[i] = PoisonMessage(f"not a node event: {err}")
                continue
            try:
                await self.one(event)
            except VersionConflict as err:
                outcomes[i] = RetryLater(f"record of {err} changed meanwhile", 0.1)
        return outcomes

    async def one(self, event: object) -> None:
        m = self.monitor
        if isinstance(event, NodeRegistered):
            record = await m.records.load(event.node.node_id)
            if record.state == NodeState.LOST:
                await m.on_command(HeartbeatResumed(node_id=event.node.node_id))
        elif isinstance(event, NodeLost):
            boot = await m.store.redis.hget(m.store.key("node", event.node_id), "boot_id")
            if boot != event.boot_id:
                return  # a newer boot of the node reports: it is not lost
            lost = Finding(
                node_id=event.node_id, gpu=None, kind=FindingKind.HEARTBEAT_TIMEOUT, severity=Severity.FATAL,
                action=Remedy.REBOOT_NODE, message=event.reason, at=event.at, rules_version=m.policy.rules_version,
            )  # fmt: skip
            await m.on_findings([lost], limited=False)  # the node is already lost: nothing to hold back
        elif isinstance(event, CordonNode | DrainNode | UncordonNode):
            if self.clock() - event.at > COMMAND_MAX_AGE_S:
                log.warning("ignoring %s of %s from %.0f s ago", type(event).__name__, event.node_id, self.clock() - event.at)
                return
            kind = {CordonNode: Cordon, DrainNode: Drain, UncordonNode: Uncordon}[type(event)]
            await m.on_command(kind(node_id=event.node_id, by=event.by, reason=event.reason), by=event.by)


class LivenessCheck:
    """Marks silent nodes lost and fails the runs that were on them."""

    def __init__(self, bus: Bus, store: Store, timeout_s: float, clock: Callable[[], float]) -> None:
        self.bus = bus
        self.store = store
        self.timeout_s = timeout_s
        self.clock = clock

    async def grace(self) -> None:
        """Give every known node a full timeout from now (called at start)."""
        now = self.clock()
        nodes = await views.list_nodes(self.store)
        if nodes:
            await self.store.redis.zadd(self.store.key("hb"), {n.node_id: now for n in nodes}, gt=True)

    async def run_once(self) -> int:
        now = self.clock()
        last_seen = dict(await self.store.redis.zrange(self.store.key("hb"), 0, -1, withscores=True))
        requests: list[PublishRequest] = []
        for node in await views.list_nodes(self.store):
            if node.info is None:
                continue
            seen = last_seen.get(node.node_id)
            just_lost = False
            if node.state == "healthy" and (seen is None or now - seen > self.timeout_s):
                if seen is None:  # registered but never heard from: start its clock now
                    await self.store.redis.zadd(self.store.key("hb"), {node.node_id: now}, nx=True)
                    continue
                lost = NodeLost(
                    at=now, node_id=node.node_id, cluster=node.info.cluster, boot_id=node.boot_id or "",
                    last_heartbeat_at=seen, reason=f"no heartbeat for {now - seen:.1f}s",
                )  # fmt: skip
                requests.append(
                    PublishRequest(
                        subjects.node(node.info.cluster, node.node_id), lost, f"lost:{node.node_id}:{node.boot_id}"
                    )
                )
                log.warning("node %s lost: %s", node.node_id, lost.reason)
                just_lost = True
            if node.state == "lost" or just_lost:
                requests.extend(await self._fail_runs_on(node.node_id, now))
        results = await self.bus.publish_many(requests)
        for r in results:
            if isinstance(r, Exception):
                log.warning("health publish failed: %r", r)
        return len(requests)

    async def _fail_runs_on(self, node_id: str, now: float) -> list[PublishRequest]:
        requests = []
        for job in await views.get_jobs(self.store, await views.jobs_on_node(self.store, node_id), with_spec=False):
            if job.run_id is None or job.status not in ("placed", "running"):
                continue
            failed = RunFailed(
                at=now, job_id=job.job_id, tenant=job.tenant, run_id=job.run_id, reason="node_failure",
                message=f"node {node_id} was lost", node_id=node_id,
            )  # fmt: skip
            requests.append(PublishRequest(subjects.job(job.tenant, job.job_id), failed, f"{job.run_id}:failed"))
        return requests
