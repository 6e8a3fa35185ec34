"""Health's handlers.

- ``TelemetryHandler`` (TELEMETRY): heartbeats, GPU samples and XIDs; samples
  and XIDs go through the rules and the monitor.
- ``NodeEventsHandler`` (NODES): registrations (a lost node that reports again
  goes to repair), ``NodeLost`` (the record follows), and operator commands.

A heartbeat is recorded per node and boot at the time JetStream stored it
(one clock for the whole fleet, so neither a node's wrong clock nor health's
own stall changes how long a node was silent); the liveness check
(``liveness.py``) judges on those times.  A heartbeat of a lost node's
registered boot, newer than any read before, brings the node back through
repair (``HeartbeatResumed``): the loss was a false alarm and does not count
toward the lemon rule.  Heartbeats of other boots change nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import msgspec

from trainyard.bus import Delivery, Outcome, PoisonMessage, RetryLater, Subscription
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
from trainyard.core.health.liveness import heartbeat_resumes
from trainyard.domain.node import NodeState
from trainyard.events import NodeEvent, NodeHeartbeat, NodeLost, NodeRegistered, decode_node_event
from trainyard.events.nodes import CordonNode, DrainNode, GpuTelemetry, UncordonNode, XidObserved
from trainyard_health.fencing import ProjectionBehind
from trainyard_health.monitor import Monitor
from trainyard_health.records import VersionConflict

#: Operator commands older than this when health first sees them (a new
#: consumer replaying the stream) are not carried out.
COMMAND_MAX_AGE_S = 300.0

log = logging.getLogger(__name__)


class _NodeEvents(Subscription[NodeEvent]):
    """Subscriptions to events about nodes (NODES and TELEMETRY)."""

    def decode(self, subject: str, data: bytes) -> NodeEvent:
        try:
            return decode_node_event(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as err:
            raise PoisonMessage(f"not a node event: {err}") from None


class TelemetryHandler(_NodeEvents):
    """Heartbeats, samples and XIDs from agents; one batch -> one monitor decision."""

    def __init__(self, monitor: Monitor, clock: Callable[[], float]) -> None:
        self.monitor = monitor
        self.store = monitor.store
        self.clock = clock

    async def handle(self, batch: Sequence[Delivery[NodeEvent]]) -> list[Outcome]:
        outcomes = [Outcome.done()] * len(batch)
        now = self.clock()
        findings: list[Finding] = []
        beats: list[tuple[str, str, float]] = []
        records = self.monitor.records
        for i, delivery in enumerate(batch):
            event = delivery.event
            if isinstance(event, NodeHeartbeat):
                # When JetStream stored it: the fleet's clock for heartbeats.
                at = delivery.stored_at if delivery.stored_at is not None else now
                beats.append((event.node_id, event.boot_id, at))
            elif isinstance(event, XidObserved):
                record = await records.load(event.node_id)
                findings += evaluate_xids(record, event.events, self.monitor.policy)
                for x in event.events:
                    self.monitor.metrics.xids.labels(str(x.xid)).inc()
            elif isinstance(event, GpuTelemetry):
                if event.sample.node_id != event.node_id:
                    outcomes[i] = Outcome.poison(f"sample of {event.sample.node_id} sent as {event.node_id}")
                    continue
                record = await records.load(event.node_id)
                previous = await records.previous_sample(event.node_id)
                if previous is not None and previous.at >= event.sample.at:
                    continue  # an older reading, delivered late
                findings += evaluate_sample(record, event.sample, previous, self.monitor.policy)
                await records.keep_sample(event.sample)
        read = await records.record_heartbeats(beats)
        resumed = sorted(
            {b.node_id for b in read if heartbeat_resumes(b.state or "", b.registered_boot, b.boot_id, b.advanced)}
        )
        try:
            await self.monitor.on_findings(findings)
            for node_id in resumed:
                log.warning("node %s heartbeats again with the boot declared lost: bringing it back", node_id)
                await self.monitor.on_command(HeartbeatResumed(node_id=node_id, same_boot=True))
        except (VersionConflict, ProjectionBehind) as err:
            raise retry_of(err) from err
        return outcomes


def retry_of(err: VersionConflict | ProjectionBehind) -> RetryLater:
    """A health record changed meanwhile: retry at once; a projection behind: a little later."""
    if isinstance(err, VersionConflict):
        return RetryLater(f"record of {err} changed meanwhile", 0.1)
    return RetryLater(str(err), 0.5)


class NodeEventsHandler(_NodeEvents):
    """Registrations, losses and operator commands from the NODES stream."""

    def __init__(self, monitor: Monitor, clock: Callable[[], float]) -> None:
        self.monitor = monitor
        self.clock = clock

    async def handle(self, batch: Sequence[Delivery[NodeEvent]]) -> list[Outcome]:
        outcomes = []
        for delivery in batch:
            try:
                await self.one(delivery.event)
            except (VersionConflict, ProjectionBehind) as err:
                outcomes.append(Outcome.failed(retry_of(err)))
                continue
            outcomes.append(Outcome.done())
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
                node_id=event.node_id,
                gpu=None,
                kind=FindingKind.HEARTBEAT_TIMEOUT,
                severity=Severity.FATAL,
                action=Remedy.REBOOT_NODE,
                message=event.reason,
                at=event.at,
                rules_version=m.policy.rules_version,
            )
            await m.on_findings([lost], limited=False)  # the node is already lost: nothing to hold back
        elif isinstance(event, CordonNode | DrainNode | UncordonNode):
            if self.clock() - event.at > COMMAND_MAX_AGE_S:
                log.warning(
                    "ignoring %s of %s from %.0f s ago", type(event).__name__, event.node_id, self.clock() - event.at
                )
                return
            kind = {CordonNode: Cordon, DrainNode: Drain, UncordonNode: Uncordon}[type(event)]
            await m.on_command(kind(node_id=event.node_id, by=event.by, reason=event.reason), by=event.by)
