"""Typed subscriptions: what a durable consumer's handler is given and what it gives back.

A consumer's logic is a :class:`Subscription`.  It says how a message becomes
its event type (:meth:`~Subscription.decode`) and what a batch of typed
:class:`Delivery` values comes to (:meth:`~Subscription.handle`): one
:class:`Outcome` per delivery, carrying the events to publish.  Everything
else is the bus's, the same for every consumer (``trainyard.bus.consumer``):

1. decode each message; one that does not decode, or whose subject disagrees
   with its body, is dead-lettered with the reason and never reaches the handler;
2. hand the rest to ``handle``;
3. publish each settled outcome's events, in order, with their message ids
   and fences, before its message is acknowledged (a redelivered batch
   publishes them again under the same ids: the stream stores them once);
4. settle each message: ack, nak with a delay, or dead letter.

Handlers never ack, nak or publish their results themselves, and never
catch their way to a fate: they return one.

    class Ledger(JobEvents):
        async def handle(self, batch: Sequence[Delivery[JobEvent]]) -> list[Outcome]:
            store(d.seq, d.event for d in batch)
            return [Outcome.done()] * len(batch)
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import msgspec
from nats.js.api import PubAck

from trainyard.bus.client import PayloadTooLarge
from trainyard.bus.connection import PublishRequest
from trainyard.events import JobEvent, decode_job_event, subject_disagrees

E = TypeVar("E")


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


#: Exceptions that mean "this message can never be handled", wherever raised.
POISON_ERRORS: tuple[type[BaseException], ...] = (
    PoisonMessage,
    msgspec.DecodeError,
    msgspec.ValidationError,
    RecursionError,
    UnicodeError,
    PayloadTooLarge,
)


@dataclass(frozen=True, slots=True)
class Delivery(Generic[E]):
    """One decoded message, with what a handler may need of its envelope."""

    event: E
    subject: str
    seq: int  # its sequence in the stream (an event id, for idempotency)
    delivered: int = 1  # deliveries so far, this one included
    stored_at: float | None = None  # when the stream stored it (Unix time); None when unknown


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one delivery.  Build it with the class methods.

    ``fate`` None: handled; the ``publish`` requests are published in order
    (message id and fence as each request says) and the message is then
    acknowledged.  Otherwise the exception the bus settles the message by,
    and nothing is published: :class:`PoisonMessage` dead-letters it with
    the reason, :class:`NotCaughtUp` waits with a growing, capped delay,
    :class:`RetryLater` naks with its delay, anything else is retried with a
    growing delay until the consumer's ``max_deliver``, then dead-lettered.
    """

    publish: tuple[PublishRequest, ...] = ()
    fate: BaseException | None = None

    def __post_init__(self) -> None:
        if self.publish and self.fate is not None:
            raise ValueError("an outcome that is not settled publishes nothing")

    @classmethod
    def done(cls, *publish: PublishRequest) -> Outcome:
        """Handled (or already done): publish these, then ack."""
        return cls(publish=publish)

    @classmethod
    def poison(cls, reason: str) -> Outcome:
        """Can never be handled: dead-letter it with ``reason``."""
        return cls(fate=PoisonMessage(reason))

    @classmethod
    def retry(cls, reason: str, delay_s: float = 1.0) -> Outcome:
        """Not now: deliver it again after ``delay_s``."""
        return cls(fate=RetryLater(reason, delay_s))

    @classmethod
    def wait(cls, reason: str) -> Outcome:
        """Valid, but a projection has not caught up with it: wait, however long it takes."""
        return cls(fate=NotCaughtUp(reason))

    @classmethod
    def failed(cls, error: BaseException) -> Outcome:
        """Settled by what ``error`` is (see the class docstring)."""
        return cls(fate=error)


class Subscription(abc.ABC, Generic[E]):
    """A durable consumer's logic over events of type ``E`` (see the module docstring)."""

    @abc.abstractmethod
    def decode(self, subject: str, data: bytes) -> E:
        """The event in a message.  Raise :class:`PoisonMessage` (or let a
        msgspec error escape) for one that can never be handled."""

    @abc.abstractmethod
    async def handle(self, batch: Sequence[Delivery[E]]) -> Sequence[Outcome]:
        """One outcome per delivery, in order.  An exception raised here is
        the outcome of the whole batch (a poison error is traced to its
        message by handling the batch again one delivery at a time)."""

    async def refused(self, delivery: Delivery[E], request: PublishRequest) -> Outcome:
        """``request`` was refused by its fence (the entity moved on since the
        handler looked).  By default the message is handled again shortly;
        the publishes of the outcome returned here are not made."""
        return Outcome.retry(f"{request.subject} changed meanwhile", 0.1)

    def published(self, delivery: Delivery[E], request: PublishRequest, ack: PubAck) -> None:
        """``request`` is in its stream (``ack.duplicate``: it was already)."""


def job_event_of(subject: str, data: bytes) -> JobEvent:
    """The job event in a message; :class:`PoisonMessage` when it is not one, or when its
    subject disagrees with its body (another writer's subject, another tenant's job), which
    no reader of JOBS acts on."""
    try:
        event = decode_job_event(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as err:
        raise PoisonMessage(f"not a job event: {err}") from None
    problem = subject_disagrees(subject, event)
    if problem:
        raise PoisonMessage(problem)
    return event


class JobEvents(Subscription[JobEvent]):
    """A subscription to JOBS: events whose subject agrees with their body."""

    def decode(self, subject: str, data: bytes) -> JobEvent:
        return job_event_of(subject, data)


async def each(batch: Sequence[Delivery[E]], one: Callable[[Delivery[E]], Awaitable[Outcome]]) -> list[Outcome]:
    """Handle the deliveries one at a time; an exception raised for one is its outcome alone."""
    outcomes = []
    for delivery in batch:
        try:
            outcomes.append(await one(delivery))
        except Exception as err:  # noqa: BLE001 - settled by the consumer loop, like a returned failure
            outcomes.append(Outcome.failed(err))
    return outcomes
