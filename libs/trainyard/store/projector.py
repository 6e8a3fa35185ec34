"""Apply the JOBS and NODES streams to Redis, in order, exactly once."""

from __future__ import annotations

import asyncio
import json
import logging
from importlib import resources

import msgspec
import nats.errors
from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy
from redis.asyncio import Redis
from redis.exceptions import RedisError

from trainyard.bus.connection import Bus
from trainyard.events import (
    CheckpointSaved,
    PreemptionNotice,
    JobAccepted,
    JobAdmitted,
    JobCancelled,
    JobPlaced,
    JobRejected,
    NodeLost,
    NodeRegistered,
    RunFailed,
    RunStarted,
    RunSucceeded,
    decode_job_event,
    decode_node_event,
)
from trainyard.events import subjects
from trainyard.core.lifecycle import HEAD_OF_QUEUE_OFFSET, gpus_by_type
from trainyard.events.jobs import failure_category

log = logging.getLogger(__name__)

_json = msgspec.json.Encoder()


def _lua(name: str) -> str:
    return resources.files("trainyard.store").joinpath("lua", name).read_text()


class Store:
    """A Redis client plus the key prefix of one Trainyard installation."""

    def __init__(self, redis: Redis, prefix: str = "ty:") -> None:
        self.redis = redis
        self.prefix = prefix
        self._apply_job = redis.register_script(_lua("apply_job_event.lua"))
        self._apply_node = redis.register_script(_lua("apply_node_event.lua"))

    @classmethod
    def from_url(cls, url: str, prefix: str = "ty:") -> Store:
        return cls(Redis.from_url(url, decode_responses=True), prefix)

    def key(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    async def close(self) -> None:
        await self.redis.aclose()

    async def last_seq(self, projection: str) -> int:
        value = await self.redis.hget(self.key("proj", projection), "last_seq")
        return int(value or 0)

    async def flush(self) -> None:
        """Drop every key of this installation (for ``trainyard admin rebuild``)."""
        async for key in self.redis.scan_iter(match=self.prefix + "*", count=1000):
            await self.redis.delete(key)


def job_event_args(seq: int, event: object) -> list[str]:
    """The Lua arguments for one job event (see apply_job_event.lua, which
    applies the rules of :func:`trainyard.core.lifecycle.apply`)."""
    head = [str(seq), type(event).__name__]
    if isinstance(event, JobAccepted):
        spec = event.spec
        # Lua's cjson turns [] into {} and back; keep the spec as opaque JSON text.
        return head + [
            event.job_id, repr(event.at), spec.tenant, spec.queue, str(seq),
            json.dumps(gpus_by_type(spec)), _json.encode(spec).decode(), repr(event.submitted_at),
            spec.priority_class, spec.name, str(spec.total_gpus), str(spec.max_retries),
        ]  # fmt: skip
    if isinstance(event, JobRejected):
        errors = _json.encode(event.errors).decode()
        return head + [event.job_id, repr(event.at), event.tenant, errors, str(seq)]
    if isinstance(event, JobAdmitted):
        return head + [event.job_id, repr(event.at), event.run_id, str(event.attempt)]
    if isinstance(event, JobPlaced):
        replicas = _json.encode(event.replicas).decode()
        return head + [event.job_id, repr(event.at), event.run_id, replicas, event.cluster]
    if isinstance(event, (RunStarted, RunSucceeded)):
        return head + [event.job_id, repr(event.at), event.run_id]
    if isinstance(event, RunFailed):
        category, (base, cap) = failure_category(event.reason)
        return head + [
            event.job_id, repr(event.at), event.run_id, event.reason, event.message, category, repr(base), repr(cap),
            str(HEAD_OF_QUEUE_OFFSET),
        ]  # fmt: skip
    if isinstance(event, PreemptionNotice):
        deadline = repr(event.at + event.grace_period_s)
        return head + [event.job_id, repr(event.at), event.run_id, deadline, event.preemptor, event.reason]
    if isinstance(event, CheckpointSaved):
        return head + [event.job_id, repr(event.at), event.run_id, str(event.step)]
    if isinstance(event, JobCancelled):
        return head + [event.job_id, repr(event.at), event.run_id or "", event.reason]
    raise TypeError(f"no projection for {type(event).__name__}")


def node_event_args(seq: int, event: object) -> list[str]:
    """The Lua arguments for one node event (see apply_node_event.lua)."""
    from trainyard.events.nodes import NodeStateChanged

    head = [str(seq), type(event).__name__]
    if isinstance(event, NodeRegistered):
        node = event.node
        info = _json.encode(node).decode()
        return head + [node.node_id, repr(event.at), info, node.gpu_type, str(node.gpus), node.cluster, event.boot_id]
    if isinstance(event, NodeLost):
        return head + [event.node_id, repr(event.at), event.boot_id, event.reason]
    if isinstance(event, NodeStateChanged):
        return head + [event.node_id, repr(event.at), event.state, event.reason, event.by]
    return head + ["", repr(getattr(event, "at", 0.0))]  # other node events only move last_seq


class ProjectionLost(Exception):
    """Redis holds less of the projection than this process saw applied."""


class Projector:
    """Follows one stream with an ordered consumer and folds it into Redis.

    Several processes may project the same stream into the same Redis: the
    fold is idempotent and a projector skips what another already applied.
    The deciders (admission, placement) each run a JOBS projector, since they
    must read their own writes; either one keeps the projection current for
    readers such as the gateway and health.  NODES is projected by every
    process that reads nodes.

    ``position`` is the last sequence this process has seen applied (by itself
    or by another projector); a decider that published an event with sequence
    ``s`` waits for ``position >= s`` before it reads the projection again.
    """

    def __init__(self, bus: Bus, store: Store, stream: str) -> None:
        if stream not in ("JOBS", "NODES"):
            raise ValueError(f"no projection for stream {stream}")
        self.bus = bus
        self.store = store
        self.stream = stream
        self.position = 0
        self.changed = asyncio.Event()  # set after every applied batch
        self._touched: set[str] = set()  # ids of entities with events since the last drain
        self.lost_count = 0  # times Redis was found to have lost the projection
        self._advanced = asyncio.Condition()

    @property
    def projection(self) -> str:
        return self.stream.lower()

    async def apply(self, batch: list[tuple[int, bytes]]) -> int:
        """Apply raw stream messages ``(seq, data)`` in order; returns how many changed state."""
        pipe = self.store.redis.pipeline(transaction=False)
        script = self.store._apply_job if self.stream == "JOBS" else self.store._apply_node
        decode = decode_job_event if self.stream == "JOBS" else decode_node_event
        to_args = job_event_args if self.stream == "JOBS" else node_event_args
        for seq, data in batch:
            try:
                args = to_args(seq, decode(data))
            except (msgspec.DecodeError, msgspec.ValidationError, TypeError) as err:
                # A message we cannot read must not stall the fold: record and move on.
                log.error("%s seq %d cannot be projected: %s", self.stream, seq, err)
                pipe.hset(self.store.key("proj", self.projection), "last_seq", seq)
                continue
            await script(keys=[self.store.prefix], args=args, client=pipe)
        results = await pipe.execute()
        return sum(1 for r in results if r == 1)

    async def _advance(self, seq: int) -> None:
        async with self._advanced:
            self.position = max(self.position, seq)
            self._advanced.notify_all()
        self.changed.set()

    def drain_touched(self) -> set[str]:
        """Ids (job or node) that had events since the last call, whichever
        process applied them: what a cache of the projection must re-read."""
        touched, self._touched = self._touched, set()
        return touched

    async def wait_for(self, seq: int, timeout: float = 10.0) -> None:
        async with self._advanced:
            await asyncio.wait_for(self._advanced.wait_for(lambda: self.position >= seq), timeout)

    async def run(self, stop: asyncio.Event, batch_size: int = 512) -> None:
        start = await self.store.last_seq(self.projection)
        await self._advance(start)
        filter_subject = subjects.JOBS_ALL if self.stream == "JOBS" else subjects.NODES_ALL
        while not stop.is_set():
            try:
                await self._follow(stop, filter_subject, batch_size)
            except ProjectionLost as err:
                # Redis lost the projection (restarted empty, flushed, failed
                # over to a stale replica): rebuild it by replaying the stream.
                log.error("%s; replaying %s from the start", err, self.stream)
                self.lost_count += 1  # caches of the projection must start over
                async with self._advanced:
                    self.position = await self.store.last_seq(self.projection)
            except (nats.errors.Error, OSError, ConnectionError, RedisError) as err:
                log.warning("%s projector: %r; resuming", self.stream, err)
                await asyncio.sleep(0.5)

    async def caught_up(self, timeout: float = 10.0) -> None:
        """Wait until the projection holds everything the stream held when called.

        Deciders call this before each snapshot, so a decision is never made on
        a projection that is still replaying or lagging behind the log."""
        info = await self.bus.js.stream_info(self.stream)
        await self.wait_for(info.state.last_seq, timeout)

    async def _check_not_lost(self) -> int:
        applied = await self.store.last_seq(self.projection)
        if applied < self.position:
            raise ProjectionLost(f"{self.stream} projection in Redis is at {applied}, behind this process's {self.position}")
        return applied

    async def _follow(self, stop: asyncio.Event, filter_subject: str, batch_size: int) -> None:
        start = max(self.position, await self.store.last_seq(self.projection)) + 1
        inbox: list[tuple[int, str, bytes]] = []
        arrived = asyncio.Event()

        async def on_msg(msg: Msg) -> None:
            inbox.append((msg.metadata.sequence.stream, msg.subject, msg.data))
            arrived.set()

        config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start)
        sub = await self.bus.js.subscribe(
            filter_subject, stream=self.stream, ordered_consumer=True, config=config, cb=on_msg,
            pending_msgs_limit=500_000,
        )  # fmt: skip
        try:
            while not stop.is_set():
                try:
                    await asyncio.wait_for(arrived.wait(), 0.5)
                except asyncio.TimeoutError:
                    await self._check_not_lost()  # a quiet stream must notice a wiped Redis too
                    continue
                arrived.clear()
                while inbox:
                    items, inbox[:] = inbox[:batch_size], inbox[batch_size:]
                    # Another process's projector may have applied these already:
                    # skip them without decoding (the Lua fold would skip them too).
                    applied = await self._check_not_lost()
                    todo = [(s, d) for s, _, d in items if s > max(self.position, applied)]
                    if todo:
                        await self.apply(todo)
                    # Only now, with Redis holding these events, may a cache re-read them.
                    self._touched.update(subject.rsplit(".", 1)[-1] for _, subject, _ in items)
                    await self._advance(items[-1][0])
        finally:
            await sub.unsubscribe()
