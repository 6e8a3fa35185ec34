"""The liveness check: marks silent nodes lost, judged only on a caught-up
view of the heartbeats (the rule is ``trainyard.core.health.liveness``).

Each check:

1. notes the TELEMETRY stream's last sequence, and waits (briefly) until the
   heartbeat consumer has acknowledged everything up to it, i.e. every
   heartbeat stored when the check began is recorded in Redis; otherwise it
   judges nobody this time; nor while the NODES projection is behind its
   stream (a node registered again, after an agent or emulator restart, is
   judged on its new boot only once the projection shows it);
2. reads the recorded heartbeats (stream time, per node and boot) and the
   projected nodes (kept while the NODES projection stands still:
   ``Monitor.roster``), moves the evidence floor (silence counts only from
   the first heartbeat read after this process started, and after every
   interruption: the whole fleet silent for longer than ``gap_s``, or this
   process's connection to NATS lost and made again), and asks the core
   which nodes are lost;
3. publishes ``NodeLost`` for each (the node events handler then isolates the
   node and fails its runs, fenced), and evacuates runs still on nodes already
   lost;
4. forgets heartbeats of boots a node no longer runs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import nats.errors
from nats.js.errors import NotFoundError

from trainyard.bus import Bus, PublishRequest
from trainyard.core.health.liveness import (
    HeartbeatView,
    LivenessVerdict,
    NodeWatch,
    evidence_floor,
    fleet_interrupted,
    judge_liveness,
)
from trainyard.events import NodeLost, subjects
from trainyard.store import Store, views
from trainyard.store.projector import wait_until_projected
from trainyard_health.monitor import Monitor

log = logging.getLogger(__name__)

HEARTBEAT_DURABLE = "health-heartbeats"


class LivenessCheck:
    """Marks silent nodes lost and evacuates the runs left on lost nodes."""

    def __init__(
        self,
        bus: Bus,
        store: Store,
        monitor: Monitor,
        timeout_s: float,
        clock: Callable[[], float],
        *,
        durable: str = HEARTBEAT_DURABLE,
        catch_up_wait_s: float = 2.0,
        gap_s: float | None = None,
    ) -> None:
        self.bus = bus
        self.store = store
        self.monitor = monitor
        self.timeout_s = timeout_s
        self.clock = clock
        self.durable = durable  # the heartbeat consumer whose progress says what has been read
        self.catch_up_wait_s = catch_up_wait_s
        self.gap_s = timeout_s / 2 if gap_s is None else gap_s  # a fleet silent this long: an interruption
        self.floor: float | None = None  # stream time from which silence counts (see evidence_floor)
        self.previous_newest: float | None = None  # the newest heartbeat of the previous caught-up read
        self.interrupted = False  # an interruption not yet followed by a heartbeat
        self._connection = self._connections()  # the bus connection the previous caught-up read was made on
        self.first_seen: dict[tuple[str, str], float] = {}  # boots never heard from -> when this process first saw them
        self.last_verdict: LivenessVerdict | None = None
        self.judged_nodes: tuple[views.ProjectedNode, ...] = ()  # the projected nodes the last verdict was judged on

    async def caught_up(self) -> bool:
        """True once every heartbeat stored when called has been read and recorded."""
        head = (await self.bus.js.stream_info("TELEMETRY")).state.last_seq
        deadline = time.monotonic() + self.catch_up_wait_s
        while True:
            try:
                info = await self.bus.js.consumer_info("TELEMETRY", self.durable)
            except NotFoundError:
                return head == 0
            if info.ack_floor.stream_seq >= head or (info.num_pending == 0 and info.num_ack_pending == 0):
                return True
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.05)

    def _connections(self) -> tuple[int, int]:
        """Changes whenever the connection to NATS was lost and made again."""
        return self.bus.generation, int(self.bus.nc.stats.get("reconnects", 0))

    async def roster_caught_up(self) -> bool:
        """True once the NODES projection holds every event its stream held when called."""
        try:
            await wait_until_projected(self.bus, self.store, "NODES", timeout=self.catch_up_wait_s)
        except TimeoutError:
            return False
        return True

    async def judge(self) -> LivenessVerdict:
        caught_up = await self.caught_up()
        roster_caught_up = await self.roster_caught_up()
        heartbeats = await self.monitor.records.heartbeats()
        now = self.clock()
        view = HeartbeatView(
            caught_up=caught_up,
            newest_at=max(heartbeats.values(), default=None),
            now=now,
            roster_caught_up=roster_caught_up,
        )
        if caught_up:
            connection = self._connections()
            if connection != self._connection:  # NATS was away: heartbeats sent meanwhile were never stored
                self.interrupted, self._connection = True, connection
            floor = evidence_floor(self.floor, self.previous_newest, heartbeats.values(), self.interrupted)
            if floor != self.floor and self.previous_newest is not None:
                log.info("liveness: silence counts from %.3f again, after an interruption", floor)
                self.interrupted = False
            self.floor = floor
            self.interrupted = self.interrupted or fleet_interrupted(view, self.gap_s)
            self.previous_newest = view.newest_at if view.newest_at is not None else self.previous_newest
        start = min(view.newest_at, now) if view.newest_at is not None else now
        watches, stale = [], []
        nodes = self.judged_nodes = (await self.monitor.roster.get()).nodes  # read again only when NODES moved
        registered = {n.node_id: n.boot_id or "" for n in nodes}
        for node in nodes:
            boot = node.boot_id or ""
            last = heartbeats.get((node.node_id, boot))
            since = node.registered_at or 0.0
            if last is None:  # a boot never heard from is watched from its registration or first sight
                since = max(since, self.first_seen.setdefault((node.node_id, boot), start))
            if self.floor is not None:  # silence before the evidence floor says nothing
                since = max(since, self.floor)
            watches.append(
                NodeWatch(
                    node_id=node.node_id, state=node.state, boot_id=boot, last_heartbeat_at=last, watched_since=since
                )
            )
        stale = [key for key in heartbeats if key[0] in registered and registered[key[0]] != key[1]]
        await self.monitor.records.forget_heartbeats(stale)
        return judge_liveness(watches, view, self.timeout_s)

    async def run_once(self) -> LivenessVerdict:
        verdict = await self.judge()
        self.last_verdict = verdict
        if not verdict.judged:
            if verdict.fleet_silent_for_s is not None:
                log.error(
                    "no heartbeat from any node for %.1f s: not declaring the fleet lost", verdict.fleet_silent_for_s
                )
            else:
                log.info("liveness not judged: %s", verdict.reason)
            return verdict
        nodes = {n.node_id: n for n in self.judged_nodes}  # the same view the verdict saw
        requests = []
        for silent in verdict.lost:
            node = nodes.get(silent.node_id)
            if node is None:
                continue
            lost = NodeLost(
                at=self.clock(),
                node_id=silent.node_id,
                cluster=node.info.cluster,
                boot_id=silent.boot_id,
                last_heartbeat_at=silent.last_heartbeat_at,
                reason=f"no heartbeat for {silent.silent_for_s:.1f} s",
            )
            msg_id = f"lost:{silent.node_id}:{silent.boot_id}:{int(silent.last_heartbeat_at * 1000)}"
            requests.append(PublishRequest(subjects.node(node.info.cluster, silent.node_id), lost, msg_id))
            log.warning("node %s lost: %s", silent.node_id, lost.reason)
        for result in await self.bus.publish_many(requests):
            if isinstance(result, Exception):
                log.warning("health publish failed: %r", result)
        # Runs placed on a node just before it was lost are evacuated too (fenced, once per run).
        for node in nodes.values():
            if node.state == "lost":
                await self.monitor.fail_runs(node.node_id, "node_failure", f"node {node.node_id} was lost")
        return verdict


async def liveness_loop(check: LivenessCheck, stop: asyncio.Event, interval_s: float) -> None:
    while not stop.is_set():
        try:
            await check.run_once()
        except (Exception, nats.errors.Error) as err:  # noqa: BLE001 - infrastructure; try again next tick
            log.warning("liveness check failed: %r", err)
        try:
            await asyncio.wait_for(stop.wait(), interval_s)
        except TimeoutError:
            pass
