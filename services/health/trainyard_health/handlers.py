"""Health's handlers: heartbeats in; ``NodeLost`` and the failure of the runs
on a lost node out.

The heartbeat clock is health's own: a heartbeat counts when health receives
it, so a node with a wrong clock is judged fairly.  After a restart every
known node gets one full timeout of grace.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import msgspec
from nats.aio.msg import Msg

from trainyard.bus import Bus, PoisonMessage, PublishRequest
from trainyard.events import NodeHeartbeat, NodeLost, RunFailed, decode_node_event, subjects
from trainyard.store import Store
from trainyard.store import views

log = logging.getLogger(__name__)


class HeartbeatHandler:
    def __init__(self, store: Store, clock: Callable[[], float]) -> None:
        self.store = store
        self.clock = clock

    async def __call__(self, msgs: Sequence[Msg]) -> list[BaseException | None]:
        outcomes: list[BaseException | None] = [None] * len(msgs)
        now = self.clock()
        pipe = self.store.redis.pipeline(transaction=False)
        for i, msg in enumerate(msgs):
            try:
                event = decode_node_event(msg.data)
            except (msgspec.DecodeError, msgspec.ValidationError) as err:
                outcomes[i] = PoisonMessage(f"not a node event: {err}")
                continue
            if isinstance(event, NodeHeartbeat):
                pipe.zadd(self.store.key("hb"), {event.node_id: now})
                pipe.hset(self.store.key("hbboot"), event.node_id, event.boot_id)
        await pipe.execute()
        return outcomes


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
