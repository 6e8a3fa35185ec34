"""Apply the JOBS and NODES streams to Redis, in order, exactly once."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence

import msgspec
import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy
from redis.exceptions import RedisError
from sqlalchemy.exc import SQLAlchemyError

from trainyard.bus.connection import Bus
from trainyard.bus.pull import message_meta
from trainyard.events import decode_job_event, decode_node_event, subject_disagrees, subjects
from trainyard.ledger.snapshots import SnapshotStore
from trainyard.store.lua_args import job_event_args, node_event_args
from trainyard.store.projection_check import jobs_missing
from trainyard.store.snapshot import restore
from trainyard.store.store import Store

log = logging.getLogger(__name__)

#: A quiet follower checks the stream this often for messages it should have
#: been delivered (a stalled subscription is replaced).
STALL_CHECK_S = 2.0
#: A delivered batch at least this long is checked against the projection in
#: Redis first, so events another process folded already are not sent again.
SKIP_APPLIED_FROM = 64


class ProjectionLost(Exception):
    """Redis holds less of the projection than this process saw applied, or
    another generation of it (wiped, rebuilt), or a fold refused a batch."""


#: What the Lua folds return when they refuse an event (and change nothing).
_REFUSED = {-1: "its epoch is gone (Redis wiped or rebuilt)", -2: "it does not continue the batch (a gap)"}


class _Stalled(Exception):
    """The subscription stopped delivering; subscribe again from the position."""


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

    ``epoch`` names the generation of the projection in Redis: a projector
    that finds no projection there starts one (a build from sequence 0), the
    others adopt it.  Every Lua apply carries the epoch and the sequence the
    projection must hold before it, and is refused otherwise, so a wipe at any
    moment is noticed before the next write: the projector then rebuilds from
    what Redis still holds (the stream start after a wipe).
    """

    def __init__(self, bus: Bus, store: Store, stream: str, snapshots: SnapshotStore | None = None) -> None:
        if stream not in ("JOBS", "NODES"):
            raise ValueError(f"no projection for stream {stream}")
        if snapshots is not None and stream != "JOBS":
            raise ValueError(f"no snapshots of the {stream} projection")
        self.bus = bus
        self.store = store
        self.stream = stream
        self.snapshots = snapshots  # a JOBS projection Redis lost starts from the newest snapshot
        self.position = 0
        self.changed = asyncio.Event()  # set after every applied batch
        self._touched: set[str] = set()  # ids of entities with events since the last drain
        self.lost_count = 0  # times Redis was found to have lost the projection
        self.unseen_count = 0  # times events another process applied were skipped, never seen here
        self.epoch = ""  # the generation of the projection this process folds into
        self._through = 0  # the last sequence handed to apply
        self._moved = asyncio.Event()  # set (and replaced) whenever position changes

    @property
    def projection(self) -> str:
        return self.stream.lower()

    async def join(self) -> int:
        """Adopt the epoch of the projection in Redis, starting a new one if
        Redis has none; returns the sequence the projection holds.

        A JOBS projection is checked before it is adopted: one that does not
        hold what its marker claims (see :mod:`trainyard.store.projection_check`)
        is dropped with every key of the installation, as a wipe would, and
        rebuilt from the stream; the other processes notice the loss as they
        notice a wipe."""
        epoch, last = await self._adopt()
        if self.stream == "JOBS" and epoch != self.epoch:
            problem = await jobs_missing(self.bus, self.store, int(last))
            if problem:
                log.error("JOBS projection does not hold what its marker claims (%s): rebuilding it", problem)
                self.lost_count += 1
                await self.store.flush()
                epoch, last = await self._adopt()
        if epoch != self.epoch:
            log.info("%s projection: epoch %s at sequence %s", self.stream, epoch, last)
        self.epoch, self._through = epoch, int(last)
        return int(last)

    async def _check_gap(self, last: int) -> None:
        """Log an error where the stream no longer holds the events after
        ``last`` (the projection's sequence): its limits removed them and no
        snapshot covered them."""
        first = (await self.bus.js.stream_info(self.stream)).state.first_seq
        if last + 1 < first:
            log.error(
                "%s projection holds through %s but the stream starts at %d: the events between are gone "
                "and no snapshot covers them",
                self.stream,
                last,
                first,
            )

    async def _adopt(self) -> tuple[str, str]:
        """The epoch and sequence of the projection in Redis: restored from
        the newest snapshot, or a new one at 0, where Redis has none."""
        if self.snapshots is not None:
            try:
                last_seq = (await self.bus.js.stream_info(self.stream)).state.last_seq
                await restore(self.store, self.snapshots, last_seq)
            except SQLAlchemyError as err:  # wait for it: a rebuild without it may lack what the stream no longer has
                raise ConnectionError(f"the JOBS snapshot cannot be read: {err!r}") from err
        key = self.store.key("proj", self.projection)
        epoch, last = await self.store._join(keys=[key], args=[uuid.uuid4().hex])
        return epoch, last

    async def apply(
        self, batch: list[tuple[int, bytes]] | list[tuple[int, bytes, str]], after: int | None = None
    ) -> int:
        """Apply raw stream messages ``(seq, data[, subject])`` in order;
        returns how many changed state.  A job event whose subject disagrees
        with its body (see :func:`subject_disagrees`) only moves the sequence.

        ``after``: the sequence the projection must hold before the first
        message (default: the last one this projector handed to apply).
        Raises :class:`ProjectionLost` if the fold refused any of them."""
        if not self.epoch:
            await self.join()
        script = self.store._apply_job if self.stream == "JOBS" else self.store._apply_node
        through = self._through if after is None else after
        calls = []
        for seq, data, *subject in batch:
            try:
                args = self._fold_args(seq, data, subject[0] if subject else None, through)
            except (msgspec.DecodeError, msgspec.ValidationError, TypeError, ValueError, RecursionError) as err:
                # A message we cannot read, or may not believe, must not stall
                # the fold: record it and move on.
                log.error("%s seq %d is not projected: %s", self.stream, seq, err)
                args = self._fold_args(seq, None, None, through)
            calls.append(args)
            through = max(through, seq)
        results = await self.store.run_script(script, calls)
        refused = [(item[0], r) for item, r in zip(batch, results, strict=True) if r in _REFUSED]
        if refused:
            seq, code = refused[0]
            raise ProjectionLost(f"{self.stream} fold refused seq {seq}: {_REFUSED[code]}")
        self._through = max(self._through, through)
        return sum(1 for r in results if r == 1)

    def _fold_args(self, seq: int, data: bytes | None, subject: str | None, after: int) -> Sequence[str | bytes]:
        """The fold's arguments for one message; ``data`` None: a message that
        cannot be read, which only moves the projection's sequence."""
        if self.stream == "NODES":
            event = None if data is None else decode_node_event(data)
            return node_event_args(seq, event, epoch=self.epoch, after=after)
        if data is None:
            return job_event_args(seq, None, b"", epoch=self.epoch, after=after)
        job_event = decode_job_event(data)
        problem = subject_disagrees(subject, job_event) if subject else None
        if problem:
            raise ValueError(problem)
        return job_event_args(seq, job_event, data, epoch=self.epoch, after=after)

    def _move(self, position: int) -> None:
        self.position = position
        moved, self._moved = self._moved, asyncio.Event()
        moved.set()

    async def _advance(self, seq: int) -> None:
        self._move(max(self.position, seq))
        self.changed.set()

    def drain_touched(self) -> set[str]:
        """Ids (job or node) that had events since the last call, whichever
        process applied them: what a cache of the projection must re-read."""
        touched, self._touched = self._touched, set()
        return touched

    async def wait_for(self, seq: int, timeout: float = 10.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.position < seq:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"{self.stream} projector at {self.position}, waited {timeout}s for {seq}")
            try:
                await asyncio.wait_for(self._moved.wait(), remaining)
            except TimeoutError:
                continue

    async def _reset(self, position: int) -> None:
        self._move(position)

    async def run(self, stop: asyncio.Event, batch_size: int = 512) -> None:
        filter_subject = subjects.JOBS_ALL if self.stream == "JOBS" else subjects.NODES_ALL
        joined = False
        while not stop.is_set():
            try:
                if not joined:
                    last = await self.join()
                    await self._check_gap(last)
                    await self._reset(last)
                    joined = True
                await self._follow(stop, filter_subject, batch_size)
            except ProjectionLost as err:
                # Redis lost the projection (restarted empty, flushed, failed
                # over to a stale replica) or refused a batch: rebuild it from
                # what Redis still holds, by replaying the stream.
                log.error("%s; replaying %s", err, self.stream)
                self.lost_count += 1  # caches of the projection must start over
                await self._reset(0)  # nobody reads a caught-up view until the rebuild
                joined = False
            except _Stalled as err:
                log.warning("%s; subscribing again", err)
            except (nats.errors.Error, OSError, ConnectionError, RedisError) as err:
                log.warning("%s projector: %r; resuming", self.stream, err)
                await asyncio.sleep(0.5)

    async def caught_up(self, timeout: float = 10.0) -> None:
        """Wait until the projection holds everything the stream held when called.

        Deciders call this before each snapshot, so a decision is never made on
        a projection that is still replaying or lagging behind the log.  Redis
        itself is checked too: a projection wiped since this process last
        looked is waited for while it is rebuilt, never read."""
        target = (await self.bus.js.stream_info(self.stream)).state.last_seq
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        delay = 0.01
        while True:
            await self.wait_for(target, max(0.0, deadline - loop.time()))
            epoch, applied = await self.store.projection_state(self.projection)
            if target == 0 or (epoch == self.epoch and applied >= target):
                return
            if loop.time() >= deadline:
                raise TimeoutError(f"{self.stream} projection not caught up with {target}")
            await asyncio.sleep(min(delay, deadline - loop.time()))  # the follower notices the loss
            delay = min(delay * 2, 0.2)

    async def _check_not_lost(self) -> int:
        epoch, applied = await self.store.projection_state(self.projection)
        if epoch != self.epoch:
            raise ProjectionLost(f"{self.stream} projection in Redis has epoch {epoch or 'none'}, not {self.epoch}")
        if applied < self.position:
            raise ProjectionLost(
                f"{self.stream} projection in Redis is at {applied}, behind this process's {self.position}"
            )
        return applied

    async def _check_not_stalled(self, delivered: int, expected: int) -> int:
        """A subscription that stayed quiet while the stream held later
        messages has stalled (a consumer lost on the server, missed
        heartbeats): replace it.  ``expected`` is the stream head seen at the
        previous check; returns the head now, for the next one."""
        if expected > max(delivered, self.position):
            raise _Stalled(f"{self.stream} delivery stalled at {delivered} with the stream at {expected}")
        return (await self.bus.js.stream_info(self.stream)).state.last_seq

    async def _check_no_hole(self, delivered: int, items: list[tuple[int, str, bytes]]) -> None:
        """A delivery that skips a sequence the stream still holds is a gap
        (messages the stream deleted are not): fold nothing past it."""
        for seq, _, _ in items:
            if seq > delivered + 1:
                try:
                    await self.bus.js.get_msg(self.stream, delivered + 1)
                except nats.js.errors.NotFoundError:
                    pass
                else:
                    raise ProjectionLost(f"{self.stream} delivery skipped from {delivered} to {seq}")
            delivered = seq

    async def _follow(self, stop: asyncio.Event, filter_subject: str, batch_size: int) -> None:
        start = max(self.position, await self._check_not_lost()) + 1
        if start - 1 > self.position:
            self.unseen_count += 1  # their ids never reach drain_touched: caches must start over
        # Redis holds this epoch through start - 1 (another projector may have
        # rebuilt it meanwhile): this process has seen that much applied, even
        # if no message before start is ever delivered to it.
        await self._advance(start - 1)
        delivered = start - 1  # the last sequence delivered before the next message
        inbox: list[tuple[int, str, bytes]] = []
        arrived = asyncio.Event()

        async def on_msg(msg: Msg) -> None:
            inbox.append((message_meta(msg)[0], msg.subject, msg.data))
            arrived.set()

        config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start)
        sub = await self.bus.js.subscribe(
            filter_subject,
            stream=self.stream,
            ordered_consumer=True,
            config=config,
            cb=on_msg,
            pending_msgs_limit=500_000,
        )
        loop = asyncio.get_running_loop()
        last_arrival, expected = loop.time(), 0
        try:
            while not stop.is_set():
                try:
                    await asyncio.wait_for(arrived.wait(), 0.5)
                except TimeoutError:
                    await self._check_not_lost()  # a quiet stream must notice a wiped Redis too
                    if loop.time() - last_arrival >= STALL_CHECK_S:
                        last_arrival = loop.time()
                        expected = await self._check_not_stalled(delivered, expected)
                    continue
                arrived.clear()
                last_arrival, expected = loop.time(), 0
                while inbox:
                    items, inbox[:] = inbox[:batch_size], inbox[batch_size:]
                    await self._check_no_hole(delivered, items)
                    if len(items) >= SKIP_APPLIED_FROM:
                        # A long batch (catching up behind another process's projector):
                        # skip what it applied already without decoding it.
                        floor = max(self.position, await self._check_not_lost())
                    else:
                        # A few live events: send them all.  The fold skips what another
                        # process applied (0) and refuses a projection wiped or rolled
                        # back meanwhile (-1, -2: ProjectionLost), so no read first.
                        floor = self.position
                    todo = [(s, d, subject) for s, subject, d in items if s > floor]
                    if todo:
                        # The fold continues from the message delivered just before.
                        after = max([delivered] + [s for s, _, _ in items if s < todo[0][0]])
                        await self.apply(todo, after=after)
                    delivered = items[-1][0]
                    # Only now, with Redis holding these events, may a cache re-read them.
                    self._touched.update(subjects.entity_id(subject) for _, subject, _ in items)
                    await self._advance(items[-1][0])
        finally:
            await sub.unsubscribe()


async def wait_until_projected(
    bus: Bus, store: Store, stream: str, seq: int | None = None, timeout: float | None = None
) -> int:
    """Wait until Redis holds the projection of ``stream`` through ``seq``
    (default: the stream's head when called); returns that sequence.

    For readers that run no projector of their own (the emulator's node
    agents, health, the gateway): while a projection is rebuilt after a loss
    they wait, polling with backoff, instead of acting on a partial view.
    NATS or Redis not answering (restarting, say) is waited out the same way.
    ``timeout`` None waits as long as it takes; otherwise TimeoutError."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    deadline = None if timeout is None else started + timeout
    delay, warned = 0.01, False
    applied = 0
    while True:
        try:
            if seq is None:
                seq = (await bus.js.stream_info(stream)).state.last_seq
            epoch, applied = await store.projection_state(stream.lower())
            if seq == 0 or (epoch and applied >= seq):
                return seq
        except (RedisError, OSError, nats.errors.Error) as err:
            log.info("waiting for the %s projection: %r", stream, err)
        now = loop.time()
        if deadline is not None and now >= deadline:
            raise TimeoutError(f"{stream} projection is at {applied}, not yet {seq if seq is not None else 'the head'}")
        if not warned and now - started > 5.0:
            log.warning("waiting for the %s projection (at %d) to reach %s", stream, applied, seq)
            warned = True
        await asyncio.sleep(delay if deadline is None else min(delay, deadline - now))
        delay = min(delay * 2, 0.5)
