"""Group commit: publishes to one stream that wait at the same time share one
durable write.

A JetStream server that fsyncs before it acknowledges (``sync_interval:
always``, the default of ``trainyard up``) pays one disk flush per stored
message, so one node acknowledges about a thousand messages a second however
many publishes are in flight.  An *atomic batch* (NATS 2.12+, a stream with
``allow_atomic``) is stored as one write with one flush and one
acknowledgement.  :class:`GroupCommit` puts the two together the way a
database's group commit does: while fewer than :data:`MIN_BATCH` publishes to
a stream are in flight, each goes out alone at once (no added latency on a
quiet bus); those that arrive beyond that wait, and go out together as one
atomic batch.  A batch has a fixed cost on the server (about 4 ms of its CPU
on this project's reference machine, whatever its size, against 0.04-0.18 ms
per message published alone), so fewer than :data:`MIN_BATCH` waiting
messages still go one by one.

An atomic batch is all or nothing, so its answers are exact: a committed batch
acknowledges every message in order (their sequences follow from the commit's
last sequence and count), and a refused batch stored none of them.  When a
batch is refused (one message's ``Nats-Msg-Id`` is a duplicate, one fence
check fails, the stream does not allow atomic batches) or its commit is not
answered, each of its messages is published again on its own and gets the
answer it would have had alone: a duplicate's first acknowledgement, a
:class:`WrongLastSequence`, an error.  A message id makes that repeat safe
when the commit was stored after all.  A server that does not know atomic
batches (it stores the messages one by one and answers the commit without a
batch count) or a stream without ``allow_atomic`` turns batching off for that
stream on this connection.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.js.api import PubAck

log = logging.getLogger(__name__)

BATCH_ID = "Nats-Batch-Id"
BATCH_SEQUENCE = "Nats-Batch-Sequence"
BATCH_COMMIT = "Nats-Batch-Commit"

#: JetStream's answer when the stream does not allow atomic batches.
ERR_ATOMIC_DISABLED = 10174

#: Messages in one batch: the server refuses batches over 1,000 by default.
MAX_BATCH = 256
#: Publishes in flight alone before the next ones wait for a batch, and the
#: fewest messages sent as one (below this a batch costs the server more CPU
#: than the messages alone: bench/nats_sync.py measures both).
MIN_BATCH = 24
#: Payload bytes in one batch, headers included.
MAX_BATCH_BYTES = 4 * 1024 * 1024
#: Batches of one stream in flight at once on one connection (the server
#: allows 50 per stream); two keep the disk busy while the next one fills.
MAX_IN_FLIGHT = 2


class _BatchAck(msgspec.Struct):
    stream: str = ""
    seq: int = 0
    batch: str | None = None
    count: int = 0
    error: dict[str, Any] | None = None


_decode = msgspec.json.Decoder(_BatchAck).decode

#: One publish: subject, payload, headers (message id already tagged).
Item = tuple[str, bytes, dict[str, str]]
SendOne = Callable[[str, bytes, dict[str, str]], Awaitable[PubAck]]


class _Waiting:
    __slots__ = ("item", "future", "size")

    def __init__(self, item: Item, future: asyncio.Future[PubAck]) -> None:
        self.item = item
        self.future = future
        subject, data, headers = item
        self.size = len(subject) + len(data) + sum(len(k) + len(v) + 4 for k, v in headers.items())


class GroupCommit:
    """Per-stream group commit over one connection (see the module's doc).

    ``send_one`` publishes a message alone and returns its ack or raises
    what the caller of a single publish would see."""

    def __init__(self, nc: Client, send_one: SendOne, timeout: float) -> None:
        self.nc = nc
        self.send_one = send_one
        self.timeout = timeout
        self._queues: dict[str, list[_Waiting]] = {}
        self._flushing: dict[str, int] = {}
        self._alone: dict[str, int] = {}
        self._off: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        #: Batches committed and messages they carried (for metrics and tests).
        self.batches = 0
        self.batched_messages = 0
        self.fallbacks = 0

    def enabled(self, stream: str) -> bool:
        return stream not in self._off

    async def publish(self, stream: str, item: Item) -> PubAck:
        alone = self._alone.get(stream, 0)
        if stream in self._off or (alone < MIN_BATCH and not self._queues.get(stream)):
            self._alone[stream] = alone + 1
            try:
                return await self.send_one(*item)
            finally:
                self._alone[stream] -= 1
        future: asyncio.Future[PubAck] = asyncio.get_running_loop().create_future()
        self._queues.setdefault(stream, []).append(_Waiting(item, future))
        if self._flushing.get(stream, 0) < MAX_IN_FLIGHT:
            self._flushing[stream] = self._flushing.get(stream, 0) + 1
            task = asyncio.get_running_loop().create_task(self._flush(stream))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await future

    def _take(self, stream: str) -> list[_Waiting]:
        queue = self._queues.get(stream, [])
        taken: list[_Waiting] = []
        size = 0
        while queue and len(taken) < MAX_BATCH:
            if taken and size + queue[0].size > MAX_BATCH_BYTES:
                break
            waiting = queue.pop(0)
            if waiting.future.done():  # its caller gave up (cancelled)
                continue
            taken.append(waiting)
            size += waiting.size
        return taken

    async def _flush(self, stream: str) -> None:
        try:
            while taken := self._take(stream):
                if len(taken) < MIN_BATCH or stream in self._off:
                    await asyncio.gather(*(self._one(w) for w in taken))
                else:
                    await self._batch(stream, taken)
        finally:
            self._flushing[stream] -= 1

    async def _one(self, waiting: _Waiting) -> None:
        try:
            ack = await self.send_one(*waiting.item)
        except Exception as err:  # noqa: BLE001 - handed to the caller
            if not waiting.future.done():
                waiting.future.set_exception(err)
        else:
            if not waiting.future.done():
                waiting.future.set_result(ack)

    async def _batch(self, stream: str, taken: list[_Waiting]) -> None:
        answer = await self._commit(taken)
        if answer is not None and answer.error is None and answer.batch is not None and answer.count == len(taken):
            first = answer.seq - answer.count + 1
            for i, waiting in enumerate(taken):
                if not waiting.future.done():
                    waiting.future.set_result(PubAck(stream=answer.stream, seq=first + i, duplicate=None))
            self.batches += 1
            self.batched_messages += len(taken)
            return
        if answer is not None and (answer.batch is None and answer.error is None):
            log.warning("stream %s: the server does not know atomic batches; publishing one by one", stream)
            self._off.add(stream)
        elif answer is not None and answer.error is not None and answer.error.get("err_code") == ERR_ATOMIC_DISABLED:
            log.warning("stream %s does not allow atomic batches; publishing one by one", stream)
            self._off.add(stream)
        self.fallbacks += 1
        await asyncio.gather(*(self._one(w) for w in taken))

    async def _commit(self, taken: list[_Waiting]) -> _BatchAck | None:
        """Send ``taken`` as one atomic batch; the server's answer to its
        commit, or None when there was none (the messages are then published
        again one by one: their ids make that safe)."""
        batch_id = uuid.uuid4().hex
        last = len(taken)
        try:
            for n, waiting in enumerate(taken[:-1], 1):
                subject, data, headers = waiting.item
                await self.nc.publish(subject, data, headers={**headers, BATCH_ID: batch_id, BATCH_SEQUENCE: str(n)})
            subject, data, headers = taken[-1].item
            commit = {**headers, BATCH_ID: batch_id, BATCH_SEQUENCE: str(last), BATCH_COMMIT: "1"}
            msg = await self.nc.request(subject, data, timeout=self.timeout, headers=commit)
        except Exception as err:  # noqa: BLE001 - whatever stopped it, each message goes again alone
            log.debug("atomic batch of %d not answered (%r); publishing one by one", last, err)
            return None
        try:
            return _decode(msg.data)
        except msgspec.DecodeError:
            return None

    async def close(self) -> None:
        """Wait for the batches in flight (their callers are waiting too)."""
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
