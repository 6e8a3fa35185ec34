"""Durable pull consumers, and the one place where a subscription's outcome
becomes published events and ack, nak-with-delay or dead-letter.

A consumer runs a :class:`~trainyard.bus.subscription.Subscription`: the bus
decodes each message into the subscription's event type, hands the batch to
its handler, publishes the events each outcome carries and settles each
message by its outcome's fate (see ``subscription.py``).  A message that does
not decode is poison.  :class:`NotCaughtUp` (a valid message that waits for a
projection) is nakked with a growing, capped delay, for as long as it takes,
never dead-lettered; :class:`RetryLater` with its delay.  Broken
infrastructure (NATS, Redis, the database) and unexpected exceptions are
retried with a delay until ``max_deliver``; the last attempt dead-letters.
The server itself never gives up on a message (its ``max_deliver`` is
unlimited): only :func:`settle` decides that a message is dead.

No message can stop a consumer.  A decode error, a ``RecursionError`` from
JSON nested too deeply, or a result too large to publish is poison like a
:class:`PoisonMessage`, also when it escapes a batch handler: the batch is
then handled again one message at a time so that only the bad message is
dead-lettered.  A dead letter keeps the first :data:`DEAD_LETTER_KEEP_BYTES`
of the data with the original size, subject and sequence, so it always fits
in a message.  Failures to ack, nak, terminate or dead-letter are logged and
the message is left to be redelivered; they never end the consumer.

The same loop runs over the real bus (:class:`~trainyard.bus.Bus`) and over
the in-memory fake in ``trainyard.testing.fakes``: both are a :class:`Broker`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol

import msgspec
import nats.errors
from nats.js.api import PubAck

from trainyard.bus import reread
from trainyard.bus.client import PublishDenied, header_value
from trainyard.bus.connection import Bus, WrongLastSequence
from trainyard.bus.pull import BatchPull, ConsumerChanged, message_meta
from trainyard.bus.subscription import (
    POISON_ERRORS,
    Delivery,
    NotCaughtUp,
    Outcome,
    PoisonMessage,
    RetryLater,
    Subscription,
)
from trainyard.events import subjects

log = logging.getLogger(__name__)

#: How much of a dead message's data its dead letter keeps.
DEAD_LETTER_KEEP_BYTES = 64 * 1024


class ConsumerSpec(msgspec.Struct, frozen=True):
    stream: str
    durable: str
    filter_subject: str
    batch: int = 256
    max_deliver: int = 10
    ack_wait_s: float = 30.0
    max_ack_pending: int = 20_000
    retry_delay_s: float = 1.0
    #: Fetch at most once per ``linger_s``, each time taking what the server
    #: gathered meanwhile in one go (up to ``batch``): a steady trickle
    #: (heartbeats) is handled in a few full batches a second, a message
    #: waits at most ``linger_s`` (the first after a quiet spell not at all),
    #: and a backlog is taken a full batch at a time.  0: every fetch keeps a
    #: request open and takes each message as it comes.
    linger_s: float = 0.0


class _Sequences(Protocol):
    @property
    def stream(self) -> int: ...


class _Metadata(Protocol):
    @property
    def sequence(self) -> _Sequences: ...
    @property
    def num_delivered(self) -> int: ...
    @property
    def timestamp(self) -> datetime: ...


class Pulled(Protocol):
    """A message fetched from a durable consumer (``nats.aio.msg.Msg``, or the fake's)."""

    subject: str
    data: bytes

    @property
    def metadata(self) -> _Metadata: ...
    async def ack(self) -> None: ...
    async def nak(self, delay: float | None = None) -> None: ...
    async def term(self) -> None: ...


class Puller(Protocol):
    async def fetch(self, batch: int = 1, timeout: float | None = 5) -> Sequence[Pulled]: ...


class Broker(Protocol):
    """What a consumer needs of a bus."""

    generation: int  # bumped when the connection was opened anew: pull again

    async def publish(
        self,
        subject: str,
        message: Any,
        msg_id: str,
        expected_last_subject_seq: int | None = None,
        fence_subject: str | None = None,
    ) -> PubAck: ...
    async def publish_raw(self, subject: str, data: bytes, headers: dict[str, str]) -> PubAck: ...
    async def pull(self, spec: ConsumerSpec) -> Puller: ...


async def dead_letter(bus: Broker, stream: str, msg: Pulled, reason: str) -> None:
    """Copy ``msg`` to the dead-letter stream with ``reason``: the first
    :data:`DEAD_LETTER_KEEP_BYTES` of its data, its size, subject and sequence."""
    seq = message_meta(msg)[0]
    data = msg.data or b""
    kept = data[:DEAD_LETTER_KEEP_BYTES]
    headers = {
        "Trainyard-Reason": header_value(reason),
        "Trainyard-Subject": header_value(msg.subject),
        "Trainyard-Stream-Seq": str(seq),
        "Trainyard-Size": str(len(data)),
        "Nats-Msg-Id": f"dlq:{stream}:{seq}",
    }
    if len(kept) < len(data):
        headers["Trainyard-Truncated"] = f"kept the first {len(kept)} of {len(data)} bytes"
    await bus.publish_raw(subjects.deadletter(stream), kept, headers)


def poison_reason(outcome: BaseException) -> str:
    if isinstance(outcome, PoisonMessage):
        return str(outcome)
    if isinstance(outcome, RecursionError):
        return "cannot be decoded: nested too deeply"
    if isinstance(outcome, (msgspec.DecodeError, msgspec.ValidationError, UnicodeError)):
        return f"cannot be decoded: {outcome}"
    return f"cannot be handled: {outcome}"


async def _kill(bus: Broker, spec: ConsumerSpec, msg: Pulled, reason: str) -> str:
    try:
        await dead_letter(bus, spec.stream, msg, reason)
    except Exception as err:  # noqa: BLE001 - the message stays; it is tried again later
        log.error("%s: could not dead-letter %s (%s): %r; retrying later", spec.durable, msg.subject, reason, err)
        await msg.nak(delay=spec.retry_delay_s * 5)
        return "retry"
    await msg.term()
    return "dead-letter"


async def settle(bus: Broker, spec: ConsumerSpec, msg: Pulled, fate: BaseException | None) -> str:
    """Map one fate to ack, nak or dead letter; returns the fate's name (for
    metrics).  Never raises: a failure to settle leaves the message to be redelivered."""
    try:
        return await _settle(bus, spec, msg, fate)
    except Exception as err:  # noqa: BLE001 - redelivered after ack_wait; handlers are idempotent
        log.warning("%s: could not settle %s: %r; it will be redelivered", spec.durable, msg.subject, err)
        return "unsettled"


async def _settle(bus: Broker, spec: ConsumerSpec, msg: Pulled, fate: BaseException | None) -> str:
    if fate is None:
        await msg.ack()
        return "ack"
    delivered = message_meta(msg)[1]
    if isinstance(fate, POISON_ERRORS):
        return await _kill(bus, spec, msg, poison_reason(fate))
    if isinstance(fate, NotCaughtUp):
        await msg.nak(delay=min(fate.delay_s * delivered, fate.max_delay_s))
        return "wait"
    if delivered >= spec.max_deliver:
        return await _kill(bus, spec, msg, f"gave up after {delivered} deliveries: {fate!r}")
    delay = fate.delay_s if isinstance(fate, RetryLater) else spec.retry_delay_s * min(delivered, 10)
    if not isinstance(fate, RetryLater):
        log.warning("%s: retrying %s in %.1fs after %r", spec.durable, msg.subject, delay, fate)
    await msg.nak(delay=delay)
    return "retry"


def delivery(msg: Pulled, event: Any) -> Delivery[Any]:
    seq, delivered, stored_at = message_meta(msg)
    return Delivery(event, msg.subject, seq, delivered, stored_at)


async def handle_batch(
    subscription: Subscription[Any], batch: Sequence[Delivery[Any]], durable: str = ""
) -> list[Outcome]:
    """One outcome per delivery.  A poison error that fails the whole batch is
    traced to its message by handling the batch again one delivery at a time."""
    if not batch:
        return []
    try:
        outcomes = list(await subscription.handle(batch))
    except POISON_ERRORS as err:
        if len(batch) == 1:
            return [Outcome.failed(err)]
        log.warning("%s: batch of %d failed with %r; handling one message at a time", durable, len(batch), err)
        return [(await handle_batch(subscription, [d], durable))[0] for d in batch]
    except Exception as err:  # noqa: BLE001 - the whole batch failed: infrastructure, most likely
        log.warning("%s: batch of %d failed: %r", durable, len(batch), err)
        return [Outcome.failed(err)] * len(batch)
    if len(outcomes) != len(batch):
        bug = RuntimeError(f"the handler gave {len(outcomes)} outcomes for {len(batch)} messages")
        return [Outcome.failed(bug)] * len(batch)
    return outcomes


async def publish_outcome(
    bus: Broker, subscription: Subscription[Any], done: Delivery[Any], outcome: Outcome
) -> Outcome:
    """Publish what ``outcome`` carries, in order; the outcome to settle by:
    ``outcome`` itself once all are stored, or why one was not."""
    for req in outcome.publish:
        try:
            try:
                ack = await bus.publish(
                    req.subject, req.message, req.msg_id, req.expected_last_subject_seq, req.fence_subject
                )
            except WrongLastSequence:
                return Outcome(fate=(await subscription.refused(done, req)).fate)
            subscription.published(done, req, ack)
        except Exception as err:  # noqa: BLE001 - settled like a handler's failure; republished under the same id
            return Outcome.failed(err)
    return outcome


async def consume(
    bus: Broker, spec: ConsumerSpec, subscription: Subscription[Any], msgs: Sequence[Pulled]
) -> list[str]:
    """One fetched batch, start to end: decode, handle, publish, settle.
    Returns each message's fate (``ack``, ``retry``, ``wait``, ``dead-letter``, ``unsettled``)."""
    outcomes: list[Outcome] = [Outcome()] * len(msgs)
    decoded: list[tuple[int, Delivery[Any]]] = []
    for i, msg in enumerate(msgs):
        try:
            decoded.append((i, delivery(msg, subscription.decode(msg.subject, msg.data or b""))))
        except Exception as err:  # noqa: BLE001 - a decode error is poison; settle() says what else is
            outcomes[i] = Outcome.failed(err)
    handled = await handle_batch(subscription, [d for _, d in decoded], spec.durable)
    published = await asyncio.gather(
        *(publish_outcome(bus, subscription, d, outcome) for (_, d), outcome in zip(decoded, handled, strict=True))
    )
    for (i, _), outcome in zip(decoded, published, strict=True):
        outcomes[i] = outcome
    return [await settle(bus, spec, msg, outcome.fate) for msg, outcome in zip(msgs, outcomes, strict=True)]


async def fetch(sub: Puller, spec: ConsumerSpec) -> list[Pulled]:
    """One batch: what is there, else the first message to come within 0.5 s.

    With ``spec.linger_s`` set, what the server holds is taken in one go
    (``fetch`` with ``timeout=0``: a few reads, not a wake-up per message);
    when it holds nothing, the first message to come is handled alone and at
    once.  :func:`run_consumer` spaces these fetches ``linger_s`` apart."""
    if spec.linger_s <= 0:
        return list(await sub.fetch(spec.batch, timeout=0.5))
    try:
        return list(await sub.fetch(spec.batch, timeout=0))
    except TimeoutError:  # nothing stored now: wait for the first
        return list(await sub.fetch(1, timeout=0.5))


async def catch_up(
    bus: Broker, spec: ConsumerSpec, subscription: Subscription[Any], first: int, stop: asyncio.Event
) -> int:
    """Hand ``subscription`` every message of the consumer's filter from
    stream sequence ``first`` to the stream's last, read back from the stream
    in order (see trainyard.bus.reread): what a consumer another client had
    changed may have skipped.  Each is settled as :func:`consume` does; a
    nakked one is handed again after its delay.  Returns how many were read."""
    if not isinstance(bus, Bus):
        return 0
    last = (await bus.js.stream_info(spec.stream)).state.last_seq
    count = 0
    while first <= last and not stop.is_set():
        batch = await reread.read(bus.js, spec.stream, first, last, spec.filter_subject, spec.batch)
        if not batch:
            break
        first, count = batch[-1].seq + 1, count + len(batch)
        while batch and not stop.is_set():
            await consume(bus, spec, subscription, batch)
            batch = [m for m in batch if m.fate == "nak"]
            for m in batch:
                m.delivered += 1
            if batch:
                await asyncio.sleep(min(max(m.delay for m in batch), 5.0))
    log.warning("%s: handled again %d message(s) of %s up to sequence %d", spec.durable, count, spec.stream, last)
    return count


def _changed(spec: ConsumerSpec, sub: Any, unsure_from: int | None) -> int | None:
    """Where to catch up from after a pull: the earlier of ``unsure_from`` and
    what the pull found when it put back a changed consumer (logged here)."""
    changed = getattr(sub, "changed", None)  # Bus.pull's BatchPull; the fake has none
    if isinstance(changed, ConsumerChanged):
        log.error("%s: %s; its settings were put back", spec.durable, changed)
        return _earlier(unsure_from, changed.unsure_from)
    return unsure_from


def _earlier(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


async def run_consumer(bus: Broker, spec: ConsumerSpec, subscription: Subscription[Any], stop: asyncio.Event) -> None:
    """Fetch batches from a durable consumer and :func:`consume` each, until ``stop``.

    Only a consumer that cannot be made at start raises; after that the loop
    keeps going through lost connections and bad messages, subscribing again
    when the bus had to open its connection anew.  A consumer whose settings
    another client changed (see trainyard.bus.pull) is put back, logged as an
    error naming what changed, and what it may have skipped meanwhile is
    handled again before it pulls on (:func:`catch_up`)."""
    generation = bus.generation
    sub = await bus.pull(spec)
    unsure_from = _changed(spec, sub, None)  # the first stream sequence to hand again, if any
    loop = asyncio.get_running_loop()
    next_fetch = 0.0  # with linger_s: the next fetch not before this (loop time)
    while not stop.is_set():
        if (wait := next_fetch - loop.time()) > 0:
            await asyncio.sleep(wait)
        fetched_at = loop.time()
        if generation != bus.generation:  # the connection was opened anew: subscriptions are gone
            try:
                generation = bus.generation
                old, sub = sub, await bus.pull(spec)
                unsure_from = _changed(spec, sub, unsure_from)
                if isinstance(old, BatchPull):  # what it still holds goes to the new one
                    await old.release()
            except ConsumerChanged as err:
                log.error("%s: %s; its settings could not be put back, not consuming", spec.durable, err)
                generation = -1
                await asyncio.sleep(5.0)
                continue
            except (TimeoutError, nats.errors.Error) as err:
                log.warning("%s: could not subscribe again: %r", spec.durable, err)
                generation = -1
                await asyncio.sleep(0.5)
                continue
        if unsure_from is not None:
            try:
                await catch_up(bus, spec, subscription, unsure_from, stop)
                unsure_from = None
            except PublishDenied as err:  # this user may not read its stream back: say so, once
                log.error("%s: cannot read %s back from sequence %d: %s", spec.durable, spec.stream, unsure_from, err)
                unsure_from = None
            except (TimeoutError, nats.errors.Error) as err:
                log.warning("%s: could not catch up yet: %r", spec.durable, err)
                await asyncio.sleep(0.5)
                continue
        try:
            msgs = await fetch(sub, spec)
        except ConsumerChanged as err:
            log.error("%s: %s; putting its settings back", spec.durable, err)
            unsure_from = _earlier(unsure_from, err.unsure_from)
            generation = -1  # pull again: Bus.pull puts the settings back
            continue
        except TimeoutError:  # nothing to fetch (nats.errors.TimeoutError is one too): a quiet spell
            continue
        except nats.errors.Error as err:  # reconnecting, slow consumer, ...: try again shortly
            log.warning("%s: fetch failed: %r", spec.durable, err)
            await asyncio.sleep(0.5)
            continue
        next_fetch = fetched_at + spec.linger_s
        await consume(bus, spec, subscription, msgs)
    if isinstance(sub, BatchPull):  # stopped: a loop started again on this connection gets what comes next
        await sub.release()
