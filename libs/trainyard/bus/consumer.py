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
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

import msgspec
import nats.errors
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from trainyard.bus.connection import Bus
from trainyard.events import subjects

log = logging.getLogger(__name__)


class PoisonMessage(Exception):
    """The message can never be handled (bad encoding, impossible content)."""


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
    meta = msg.metadata
    headers = {
        "Trainyard-Reason": reason[:1000],
        "Trainyard-Subject": msg.subject,
        "Trainyard-Stream-Seq": str(meta.sequence.stream),
        "Nats-Msg-Id": f"dlq:{stream}:{meta.sequence.stream}",
    }
    await bus.js.publish(subjects.deadletter(stream), msg.data, headers=headers)


async def settle(bus: Bus, spec: ConsumerSpec, msg: Msg, outcome: BaseException | None) -> str:
    """Map one outcome to its fate; returns the fate's name (for metrics)."""
    if outcome is None:
        await msg.ack()
        return "ack"
    delivered = msg.metadata.num_delivered or 1
    if isinstance(outcome, PoisonMessage):
        await dead_letter(bus, spec.stream, msg, str(outcome))
        await msg.term()
        return "dead-letter"
    if isinstance(outcome, NotCaughtUp):
        await msg.nak(delay=min(outcome.delay_s * delivered, outcome.max_delay_s))
        return "wait"
    if delivered >= spec.max_deliver:
        await dead_letter(bus, spec.stream, msg, f"gave up after {delivered} deliveries: {outcome!r}")
        await msg.term()
        return "dead-letter"
    delay = outcome.delay_s if isinstance(outcome, RetryLater) else spec.retry_delay_s * min(delivered, 10)
    if not isinstance(outcome, RetryLater):
        log.warning("%s: retrying %s in %.1fs after %r", spec.durable, msg.subject, delay, outcome)
    await msg.nak(delay=delay)
    return "retry"


async def run_consumer(bus: Bus, spec: ConsumerSpec, handler: BatchHandler, stop: asyncio.Event) -> None:
    """Fetch batches from a durable consumer and settle each message, until ``stop``."""
    config = ConsumerConfig(
        durable_name=spec.durable,
        ack_policy=AckPolicy.EXPLICIT,
        deliver_policy=DeliverPolicy.ALL,
        ack_wait=spec.ack_wait_s,
        max_deliver=-1,  # settle() decides when a message is dead, never the server
        max_ack_pending=spec.max_ack_pending,
        filter_subject=spec.filter_subject,
    )
    try:  # create, or bring a consumer made with older settings up to date
        await bus.js.add_consumer(spec.stream, config)
    except nats.errors.Error as err:
        log.warning("%s: could not update the consumer: %r", spec.durable, err)
    sub = await bus.js.pull_subscribe(spec.filter_subject, durable=spec.durable, stream=spec.stream, config=config)
    while not stop.is_set():
        try:
            msgs = await sub.fetch(spec.batch, timeout=0.5)
        except asyncio.TimeoutError:  # nothing to fetch (nats.errors.TimeoutError is one too)
            continue
        except nats.errors.Error as err:  # reconnecting, slow consumer, ...: try again shortly
            log.warning("%s: fetch failed: %r", spec.durable, err)
            await asyncio.sleep(0.5)
            continue
        try:
            outcomes = await handler(msgs)
        except Exception as err:  # the whole batch failed: infrastructure, most likely
            log.warning("%s: batch of %d failed: %r", spec.durable, len(msgs), err)
            outcomes = [err] * len(msgs)
        for msg, outcome in zip(msgs, outcomes, strict=True):
            await settle(bus, spec, msg, outcome)
