"""Durable pull consumers, and the one place where a handler's outcome becomes
ack, nak-with-delay or dead-letter.

Handlers never ack or nak themselves.  They return normally (ack), raise
:class:`RetryLater` (nak with a delay), :class:`NotCaughtUp` (a valid message
that waits for a projection: nak with a growing, capped delay, for as long as
it takes, never dead-lettered), or raise :class:`PoisonMessage` (the message is
copied to the dead-letter stream with the reason, then terminated).  Broken
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
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

import msgspec
import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from trainyard.bus.client import PayloadTooLarge, header_value
from trainyard.bus.connection import Bus
from trainyard.events import JobEvent, decode_job_event, subject_disagrees, subjects

log = logging.getLogger(__name__)


class PoisonMessage(Exception):
    """The message can never be handled (bad encoding, impossible content)."""


def job_event_of(msg: Msg) -> JobEvent:
    """The job event in ``msg``; :class:`PoisonMessage` when it is not one, or when its
    subject disagrees with its body (another writer's subject, another tenant's job), which
    no reader of JOBS acts on."""
    try:
        event = decode_job_event(msg.data)
    except (msgspec.DecodeError, msgspec.ValidationError) as err:
        raise PoisonMessage(f"not a job event: {err}") from None
    problem = subject_disagrees(msg.subject, event)
    if problem:
        raise PoisonMessage(problem)
    return event


#: Exceptions that mean "this message can never be handled", wherever raised.
POISON_ERRORS: tuple[type[BaseException], ...] = (
    PoisonMessage,
    msgspec.DecodeError,
    msgspec.ValidationError,
    RecursionError,
    UnicodeError,
    PayloadTooLarge,
)

#: How much of a dead message's data its dead letter keeps.
DEAD_LETTER_KEEP_BYTES = 64 * 1024


class RetryLater(Exception):
    def __init__(self, reason: str, delay_s: float = 1.0) -> None:
        super().__init__(reason)
        self.delay_s = delay_s


class NotCaughtUp(RetryLater):
    """The message is valid, but a projection it needs has not caught up with
    it (lagging, or rebuilt after a loss): wait and retry, never dead-letter."""

    def __init__(self, reason: str, delay_s: float = 0.1, max_delay_s: float = 0.5) -> None:
        super().__init__(reason, delay_s)
        self.max_delay_s = max_delay_s


class ConsumerSpec(msgspec.Struct, frozen=True):
    stream: str
    durable: str
    filter_subject: str
    batch: int = 256
    max_deliver: int = 10
    ack_wait_s: float = 30.0
    max_ack_pending: int = 20_000
    retry_delay_s: float = 1.0


#: A batch handler returns one outcome per message: None (ack) or an exception.
BatchHandler = Callable[[Sequence[Msg]], Awaitable[Sequence[BaseException | None]]]


async def dead_letter(bus: Bus, stream: str, msg: Msg, reason: str) -> None:
    """Copy ``msg`` to the dead-letter stream with ``reason``: the first
    :data:`DEAD_LETTER_KEEP_BYTES` of its data, its size, subject and sequence."""
    meta = msg.metadata
    data = msg.data or b""
    kept = data[:DEAD_LETTER_KEEP_BYTES]
    headers = {
        "Trainyard-Reason": header_value(reason),
        "Trainyard-Subject": header_value(msg.subject),
        "Trainyard-Stream-Seq": str(meta.sequence.stream),
        "Trainyard-Size": str(len(data)),
        "Nats-Msg-Id": f"dlq:{stream}:{meta.sequence.stream}",
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


async def _kill(bus: Bus, spec: ConsumerSpec, msg: Msg, reason: str) -> str:
    try:
        await dead_letter(bus, spec.stream, msg, reason)
    except Exception as err:  # noqa: BLE001 - the message stays; it is tried again later
        log.error("%s: could not dead-letter %s (%s): %r; retrying later", spec.durable, msg.subject, reason, err)
        await msg.nak(delay=spec.retry_delay_s * 5)
        return "retry"
    await msg.term()
    return "dead-letter"


async def settle(bus: Bus, spec: ConsumerSpec, msg: Msg, outcome: BaseException | None) -> str:
    """Map one outcome to its fate; returns the fate's name (for metrics).
    Never raises: a failure to settle leaves the message to be redelivered."""
    try:
        return await _settle(bus, spec, msg, outcome)
    except Exception as err:  # noqa: BLE001 - redelivered after ack_wait; handlers are idempotent
        log.warning("%s: could not settle %s: %r; it will be redelivered", spec.durable, msg.subject, err)
        return "unsettled"


async def _settle(bus: Bus, spec: ConsumerSpec, msg: Msg, outcome: BaseException | None) -> str:
    if outcome is None:
        await msg.ack()
        return "ack"
    delivered = msg.metadata.num_delivered or 1
    if isinstance(outcome, POISON_ERRORS):
        return await _kill(bus, spec, msg, poison_reason(outcome))
    if isinstance(outcome, NotCaughtUp):
        await msg.nak(delay=min(outcome.delay_s * delivered, outcome.max_delay_s))
        return "wait"
    if delivered >= spec.max_deliver:
        return await _kill(bus, spec, msg, f"gave up after {delivered} deliveries: {outcome!r}")
    delay = outcome.delay_s if isinstance(outcome, RetryLater) else spec.retry_delay_s * min(delivered, 10)
    if not isinstance(outcome, RetryLater):
        log.warning("%s: retrying %s in %.1fs after %r", spec.durable, msg.subject, delay, outcome)
    await msg.nak(delay=delay)
    return "retry"


async def handle_batch(handler: BatchHandler, msgs: Sequence[Msg], durable: str = "") -> list[BaseException | None]:
    """One outcome per message.  A poison error that fails the whole batch is
    traced to its message by handling the batch again one message at a time."""
    try:
        outcomes = list(await handler(msgs))
    except POISON_ERRORS as err:
        if len(msgs) == 1:
            return [err]
        log.warning("%s: batch of %d failed with %r; handling one message at a time", durable, len(msgs), err)
        return [(await handle_batch(handler, [m], durable))[0] for m in msgs]
    except Exception as err:  # noqa: BLE001 - the whole batch failed: infrastructure, most likely
        log.warning("%s: batch of %d failed: %r", durable, len(msgs), err)
        return [err] * len(msgs)
    if len(outcomes) != len(msgs):
        bug = RuntimeError(f"the handler gave {len(outcomes)} outcomes for {len(msgs)} messages")
        return [bug] * len(msgs)
    return outcomes


async def run_consumer(bus: Bus, spec: ConsumerSpec, handler: BatchHandler, stop: asyncio.Event) -> None:
    """Fetch batches from a durable consumer and settle each message, until ``stop``.

    Only a consumer that cannot be made at start raises; after that the loop
    keeps going through lost connections and bad messages, subscribing again
    when the bus had to open its connection anew."""
    config = ConsumerConfig(
        durable_name=spec.durable,
        ack_policy=AckPolicy.EXPLICIT,
        deliver_policy=DeliverPolicy.ALL,
        ack_wait=spec.ack_wait_s,
        max_deliver=-1,  # settle() decides when a message is dead, never the server
        max_ack_pending=spec.max_ack_pending,
        filter_subject=spec.filter_subject,
    )

    async def subscribe() -> JetStreamContext.PullSubscription:
        try:  # create, or bring a consumer made with older settings up to date
            await bus.js.add_consumer(spec.stream, config)
        except nats.errors.Error as err:
            log.warning("%s: could not update the consumer: %r", spec.durable, err)
        return await bus.js.pull_subscribe(
            spec.filter_subject, durable=spec.durable, stream=spec.stream, config=config
        )

    generation = bus.generation
    sub = await subscribe()
    while not stop.is_set():
        if generation != bus.generation:  # the connection was opened anew: subscriptions are gone
            try:
                generation = bus.generation
                sub = await subscribe()
            except (TimeoutError, nats.errors.Error) as err:
                log.warning("%s: could not subscribe again: %r", spec.durable, err)
                generation = -1
                await asyncio.sleep(0.5)
                continue
        try:
            msgs = await sub.fetch(spec.batch, timeout=0.5)
        except TimeoutError:  # nothing to fetch (nats.errors.TimeoutError is one too)
            continue
        except nats.errors.Error as err:  # reconnecting, slow consumer, ...: try again shortly
            log.warning("%s: fetch failed: %r", spec.durable, err)
            await asyncio.sleep(0.5)
            continue
        outcomes = await handle_batch(handler, msgs, spec.durable)
        for msg, outcome in zip(msgs, outcomes, strict=True):
            await settle(bus, spec, msg, outcome)
