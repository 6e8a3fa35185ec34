"""Reads of a projection that are never older than the stream it folds.

A reader that runs no projector of its own (the gateway, the CLI through
the gateway, the metrics scrape) reads Redis directly.  After a wipe or a
Redis that restarted empty, the projection is rebuilt from the stream start:
for a while it holds some jobs and not others, and older states of those it
holds.  :class:`CaughtUpReads` answers only from a projection that holds
every event the stream held when the read began, and checks after the read
that no wipe or rebuild happened during it; otherwise it waits a little and
then raises :class:`ProjectionRebuilding`, which the gateway answers with
503 and ``Retry-After`` (gRPC UNAVAILABLE), never a 404 or an older state.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import nats.errors

from trainyard.bus import Bus
from trainyard.store.store import Store

T = TypeVar("T")

#: How long a read waits for a lagging projection before it says it is rebuilding.
WAIT_S = 2.0
#: What a caller is told to wait before asking again (HTTP ``Retry-After``).
RETRY_AFTER_S = 1
#: A stream head read this recently is used again (concurrent reads share one
#: look-up too): a read may then miss events stored in the last ``HEAD_TTL_S``,
#: as it may miss those a projector has not folded yet, but never a rebuild.
HEAD_TTL_S = 0.05


class ProjectionRebuilding(Exception):
    """The projection does not yet hold what its stream holds (rebuilt after
    a loss, or lagging): ask again after :attr:`retry_after_s`."""

    def __init__(self, projection: str, applied: int, head: int, retry_after_s: int = RETRY_AFTER_S) -> None:
        super().__init__(
            f"the {projection} projection is being rebuilt (at sequence {applied} of {head}); retry in {retry_after_s}s"
        )
        self.projection = projection
        self.applied = applied
        self.head = head
        self.retry_after_s = retry_after_s


class CaughtUpReads:
    """Runs reads of the projections of ``streams`` (JOBS, NODES) only when
    each holds its stream's head as of the start of the read."""

    def __init__(self, bus: Bus, store: Store, streams: Sequence[str] = ("JOBS",), wait_s: float = WAIT_S) -> None:
        self.bus = bus
        self.store = store
        self.streams = tuple(streams)
        self.wait_s = wait_s
        self._heads: dict[str, tuple[int, float]] = {}  # stream -> the last head read, and when its look-up began
        self._looking: dict[str, asyncio.Future[int]] = {}  # stream -> the look-up in flight

    async def _head(self, stream: str) -> int:
        """The stream's last sequence (read at most ``HEAD_TTL_S`` ago); while
        NATS does not answer, the last one read (a projection that holds it
        is still the freshest view there is)."""
        cached = self._heads.get(stream)
        if cached is not None and asyncio.get_running_loop().time() - cached[1] < HEAD_TTL_S:
            return cached[0]
        looking = self._looking.get(stream)
        if looking is None:
            looking = self._looking[stream] = asyncio.ensure_future(self._look_up(stream))
            looking.add_done_callback(lambda _: self._looking.pop(stream, None))
        return await asyncio.shield(looking)

    async def _look_up(self, stream: str) -> int:
        began = asyncio.get_running_loop().time()
        try:
            head = (await self.bus.js.stream_info(stream)).state.last_seq
        except (nats.errors.Error, OSError):
            if stream not in self._heads:
                raise
            return self._heads[stream][0]
        self._heads[stream] = (head, began)
        return head

    async def _states(self) -> list[tuple[str, int]]:
        pipe = self.store.redis.pipeline(transaction=False)
        for stream in self.streams:
            pipe.hmget(self.store.key("proj", stream.lower()), ["epoch", "last_seq"])
        return [(epoch or "", int(last or 0)) for epoch, last in await pipe.execute()]

    async def read(self, fn: Callable[[], Awaitable[T]]) -> T:
        """``fn()`` read from projections that hold every event their stream
        held when this call began, and were not wiped or rebuilt while it ran."""
        heads = [await self._head(stream) for stream in self.streams]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_s
        delay = 0.01
        while True:
            before = await self._states()
            if all(
                head == 0 or (epoch and applied >= head) for head, (epoch, applied) in zip(heads, before, strict=True)
            ):
                result = await fn()
                after = await self._states()
                if all(a[0] == b[0] and a[1] >= b[1] for a, b in zip(after, before, strict=True)):
                    return result
            if loop.time() >= deadline:
                behind = [
                    (stream, applied, head)
                    for stream, head, (epoch, applied) in zip(self.streams, heads, before, strict=True)
                    if head and (not epoch or applied < head)
                ] or [(self.streams[0], before[0][1], heads[0])]
                stream, applied, head = behind[0]
                raise ProjectionRebuilding(stream.lower(), applied, head)
            await asyncio.sleep(min(delay, max(0.0, deadline - loop.time())))
            delay = min(delay * 2, 0.2)
