"""NATS JetStream plumbing: streams, idempotent publishing, typed durable
pull consumers with one place that publishes a handler's events and maps its
outcomes to ack / nak / term, the dead-letter stream, and leader leases."""

from trainyard.bus.client import PayloadTooLarge, PublishDenied
from trainyard.bus.connection import Bus, PublishRequest, WrongLastSequence
from trainyard.bus.consumer import ConsumerSpec, run_consumer
from trainyard.bus.streams import STREAMS, ensure_streams
from trainyard.bus.subscription import (
    Delivery,
    JobEvents,
    NotCaughtUp,
    Outcome,
    PoisonMessage,
    RetryLater,
    Subscription,
    job_event_of,
)

__all__ = [
    "STREAMS",
    "Bus",
    "ConsumerSpec",
    "Delivery",
    "JobEvents",
    "NotCaughtUp",
    "Outcome",
    "PayloadTooLarge",
    "PoisonMessage",
    "job_event_of",
    "PublishDenied",
    "PublishRequest",
    "RetryLater",
    "Subscription",
    "WrongLastSequence",
    "ensure_streams",
    "run_consumer",
]
