"""In-memory fakes of the bus and of the projections, for fast tests of
service logic.  ``tests/integration/test_fakes_contract.py`` runs the same
cases against these and against real NATS and Redis; a behaviour the fakes
have is one the contract proves.  Production code never imports this module.

:class:`FakeBus` is the real :class:`~trainyard.bus.Bus` with its wire in
memory, so ``publish`` and the consumer loop (``run_consumer``, ``consume``)
run on it unchanged.  It keeps the streams
of ``trainyard.bus.streams`` with sequences; publishes with ``Nats-Msg-Id``
deduplication (inside each stream's duplicate window) and the
``Nats-Expected-Last-Subject-Sequence`` fence (over ``...-Subject`` when
given; checked first, as the server does: a repeat of a fenced publish is
refused, not a duplicate); and serves durable pull consumers: stream
order, redelivery after a nak's delay or ``ack_wait``, ack and term.  Not
modelled: ``max_age`` retention, replicas, permissions, lost connections.

:class:`FakeProjections` is :class:`~trainyard.store.projections.Projections`
folded from a fake bus's JOBS and NODES streams with the core's fold
(:class:`~trainyard.core.lifecycle.JobTable`), caught up at every read unless
``lagging``.  It fakes only that interface: the rest of the Redis projection
is read through ``trainyard.store.views`` and runs on Redis alone.
"""

from __future__ import annotations

import asyncio
import datetime
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import nats.errors
from nats.aio.msg import Msg
from nats.js.api import PubAck
from nats.js.errors import APIError

from trainyard.bus.client import PayloadTooLarge, message_size
from trainyard.bus.connection import (
    ERR_WRONG_LAST_SEQUENCE,
    EXPECTED_LAST_SUBJECT_SEQ,
    EXPECTED_LAST_SUBJECT_SEQ_SUBJECT,
    MSG_ID,
    Bus,
)
from trainyard.bus.consumer import ConsumerSpec, consume
from trainyard.bus.streams import STREAMS, StreamSpec
from trainyard.bus.subscription import Delivery, NotCaughtUp, Outcome, Subscription
from trainyard.core.admission.fit import FleetSummary
from trainyard.core.lifecycle import JobRecord, JobTable
from trainyard.domain.node import NodeInfo
from trainyard.events import NodeRegistered, decode_job_event, decode_node_event, subject_disagrees

#: The server's default ``max_payload``.
MAX_PAYLOAD = 1024 * 1024


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: ``*`` is one token, a final ``>`` one or more."""
    want, have = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or token not in ("*", have[i]):
            return False
    return len(want) == len(have)


@dataclass(frozen=True)
class Stored:
    """One message in a fake stream."""

    seq: int
    subject: str
    data: bytes
    headers: dict[str, str]
    at: float  # when it was stored (the bus's clock)


@dataclass
class FakeStream:
    spec: StreamSpec
    messages: dict[int, Stored] = field(default_factory=dict)  # seq -> message (a limit may drop some)
    last_seq: int = 0
    ids: dict[str, tuple[int, float]] = field(default_factory=dict)  # Nats-Msg-Id -> (seq, stored at)

    def holds(self, subject: str) -> bool:
        return any(subject_matches(s, subject) for s in self.spec.subjects)

    def last_on(self, pattern: str) -> int:
        return max((m.seq for m in self.messages.values() if subject_matches(pattern, m.subject)), default=0)

    def store(self, subject: str, data: bytes, headers: dict[str, str], now: float) -> PubAck:
        expected = headers.get(EXPECTED_LAST_SUBJECT_SEQ)
        if expected is not None:
            last = self.last_on(headers.get(EXPECTED_LAST_SUBJECT_SEQ_SUBJECT, subject))
            if last != int(expected):
                raise APIError(code=400, err_code=ERR_WRONG_LAST_SEQUENCE, description=f"wrong last sequence: {last}")
        msg_id = headers.get(MSG_ID)
        if msg_id is not None:
            seen = self.ids.get(msg_id)
            if seen is not None and now - seen[1] < self.spec.duplicate_window_s:
                return PubAck(stream=self.spec.name, seq=seen[0], duplicate=True)
        self.last_seq += 1
        self.messages[self.last_seq] = Stored(self.last_seq, subject, data, dict(headers), now)
        if msg_id is not None:
            self.ids[msg_id] = (self.last_seq, now)
        if self.spec.max_msgs_per_subject > 0:
            same = [m.seq for m in self.messages.values() if m.subject == subject]
            for seq in same[: -self.spec.max_msgs_per_subject]:
                del self.messages[seq]
        return PubAck(stream=self.spec.name, seq=self.last_seq)


class FakeMsg:
    """A message fetched from a fake consumer, settled like ``nats.aio.msg.Msg``."""

    def __init__(self, consumer: FakeConsumer, stored: Stored, delivered: int, consumer_seq: int) -> None:
        self._consumer = consumer
        self.subject = stored.subject
        self.data = stored.data
        self.headers = stored.headers
        self.metadata = Msg.Metadata(
            sequence=Msg.Metadata.SequencePair(consumer=consumer_seq, stream=stored.seq),
            num_pending=0,
            num_delivered=delivered,
            timestamp=datetime.datetime.fromtimestamp(stored.at, datetime.UTC),
            stream=consumer.stream.spec.name,
            consumer=consumer.spec.durable,
        )
        self._settled = False

    def _settle(self) -> int:
        if self._settled:
            raise nats.errors.MsgAlreadyAckdError(self)
        self._settled = True
        return self.metadata.sequence.stream

    async def ack(self) -> None:
        self._consumer.pending.pop(self._settle(), None)

    async def term(self) -> None:
        self._consumer.pending.pop(self._settle(), None)

    async def nak(self, delay: float | None = None) -> None:
        seq = self._settle()
        if seq in self._consumer.pending:
            self._consumer.pending[seq][1] = self._consumer.bus.clock() + (delay or 0.0)


class FakeConsumer:
    """A durable pull consumer of a fake stream (deliver all, explicit ack)."""

    def __init__(self, bus: FakeBus, stream: FakeStream, spec: ConsumerSpec) -> None:
        self.bus = bus
        self.stream = stream
        self.spec = spec
        self.next_new = 1  # the first stream sequence not delivered yet
        #: stream seq -> [deliveries so far, when it is delivered again unless settled]
        self.pending: dict[int, list[Any]] = {}
        self.consumer_seq = 0

    def _take(self, batch: int) -> list[FakeMsg]:
        now = self.bus.clock()
        due = sorted(seq for seq, (_, at) in self.pending.items() if at <= now)[:batch]
        taken = [seq for seq in due if seq in self.stream.messages]
        for seq in set(due) - set(taken):  # dropped from the stream meanwhile
            del self.pending[seq]
        while (
            len(taken) < batch
            and len(self.pending) < self.spec.max_ack_pending
            and self.next_new <= self.stream.last_seq
        ):
            seq, self.next_new = self.next_new, self.next_new + 1
            stored = self.stream.messages.get(seq)
            if stored is not None and subject_matches(self.spec.filter_subject, stored.subject):
                self.pending[seq] = [0, now]
                taken.append(seq)
        out = []
        for seq in taken:
            entry = self.pending[seq]
            entry[0] += 1
            entry[1] = now + self.spec.ack_wait_s
            self.consumer_seq += 1
            out.append(FakeMsg(self, self.stream.messages[seq], entry[0], self.consumer_seq))
        return out

    async def fetch(self, batch: int = 1, timeout: float | None = 5) -> list[FakeMsg]:
        """Up to ``batch`` messages: those due again first, then new ones;
        ``nats.errors.TimeoutError`` when none comes within ``timeout``."""
        deadline = self.bus.clock() + (timeout or 0.0)
        while True:
            msgs = self._take(batch)
            if msgs:
                return msgs
            now = self.bus.clock()
            if now >= deadline:
                raise nats.errors.TimeoutError
            wake = min([deadline, *(at for _, at in self.pending.values())])
            try:
                await asyncio.wait_for(self.bus._published().wait(), max(0.001, wake - now))
            except TimeoutError:
                pass


class FakeBus(Bus):
    """The bus with its wire in memory (see the module docstring): ``publish``
    and ``publish_many`` are the real ones over an in-memory ``publish_raw``.
    There is no connection: ``nc`` and ``js`` are None."""

    def __init__(self, clock: Callable[[], float] = time.time, max_payload: int = MAX_PAYLOAD) -> None:
        super().__init__(nc=None, js=None)  # type: ignore[arg-type]
        self.clock = clock
        self.max_payload = max_payload
        self.streams = {spec.name: FakeStream(spec) for spec in STREAMS}
        self.consumers: dict[str, FakeConsumer] = {}  # durable name -> consumer
        self._event: asyncio.Event | None = None

    def _published(self) -> asyncio.Event:
        if self._event is None:
            self._event = asyncio.Event()
        return self._event

    def stream_of(self, subject: str) -> FakeStream:
        for stream in self.streams.values():
            if stream.holds(subject):
                return stream
        raise nats.errors.NoRespondersError

    async def publish_raw(self, subject: str, data: bytes, headers: dict[str, str]) -> PubAck:
        size = message_size(data, headers)
        if size > self.max_payload:
            raise PayloadTooLarge(subject, size, self.max_payload)
        ack = self.stream_of(subject).store(subject, data, headers, self.clock())
        event, self._event = self._event, None
        if event is not None:
            event.set()
        return ack

    async def close(self) -> None:
        pass

    async def pull(self, spec: ConsumerSpec) -> FakeConsumer:  # type: ignore[override]
        consumer = self.consumers.get(spec.durable)
        if consumer is None:
            consumer = self.consumers[spec.durable] = FakeConsumer(self, self.streams[spec.stream], spec)
        consumer.spec = spec
        return consumer

    def messages(self, stream: str) -> list[Stored]:
        """What ``stream`` holds, in order."""
        return sorted(self.streams[stream].messages.values(), key=lambda m: m.seq)

    async def consume_once(self, spec: ConsumerSpec, subscription: Subscription[Any]) -> list[str]:
        """Deliver one batch to ``subscription`` without waiting, as the
        consumer loop would; each message's fate ([] when none was ready)."""
        try:
            msgs = await (await self.pull(spec)).fetch(spec.batch, timeout=0)
        except nats.errors.TimeoutError:
            return []
        return await consume(self, spec, subscription, msgs)


class Scripted(Subscription[bytes]):
    """A subscription to raw messages whose outcome ``decide`` picks per
    delivery; it keeps every delivery it was given (for tests of the bus)."""

    def __init__(self, decide: Callable[[Delivery[bytes]], Outcome] = lambda _: Outcome.done()) -> None:
        self.decide = decide
        self.seen: list[Delivery[bytes]] = []

    def decode(self, subject: str, data: bytes) -> bytes:
        return data

    async def handle(self, batch: Sequence[Delivery[bytes]]) -> list[Outcome]:
        self.seen.extend(batch)
        return [self.decide(d) for d in batch]


class FakeProjections:
    """The JOBS and NODES projections of a :class:`FakeBus`, folded in memory
    (see the module docstring).  ``lagging``: reads see what was folded
    before it was set, and the fleet is never caught up."""

    def __init__(self, bus: FakeBus) -> None:
        self.bus = bus
        self.jobs = JobTable()
        self.nodes: dict[str, NodeInfo] = {}  # node id -> as last registered
        self.nodes_seq = 0  # last NODES sequence folded
        self.lagging = False

    def catch_up(self) -> None:
        if self.lagging:
            return
        for m in self.bus.messages("JOBS"):
            if m.seq > self.jobs.last_seq:
                self._fold_job(m)
        for m in self.bus.messages("NODES"):
            if m.seq > self.nodes_seq:
                self.nodes_seq = m.seq
                try:
                    event = decode_node_event(m.data)
                except (msgspec.DecodeError, msgspec.ValidationError):
                    continue
                if isinstance(event, NodeRegistered):
                    self.nodes[event.node.node_id] = event.node

    def _fold_job(self, m: Stored) -> None:
        try:
            event = decode_job_event(m.data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            event = None
        if event is None or subject_disagrees(m.subject, event):
            self.jobs.last_seq = m.seq  # not believed: only the sequence moves
            return
        self.jobs.apply(event, m.seq)

    async def job(self, job_id: str) -> JobRecord | None:
        self.catch_up()
        return self.jobs.jobs.get(job_id)

    async def fleet(self) -> FleetSummary:
        self.catch_up()
        return FleetSummary.of((n.gpu_type, n.gpus) for n in self.nodes.values())

    async def caught_up_fleet(self) -> FleetSummary:
        if self.lagging:
            raise NotCaughtUp("the fleet is not known yet: the NODES projection lags")
        return await self.fleet()
