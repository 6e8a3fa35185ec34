"""NATS JetStream plumbing: streams, idempotent publishing, durable pull
consumers with one place that maps handler outcomes to ack / nak / term, the
dead-letter stream, and leader leases."""

from trainyard.bus.client import PayloadTooLarge, PublishDenied
from trainyard.bus.connection import Bus, PublishRequest, WrongLastSequence
from trainyard.bus.consumer import ConsumerSpec, PoisonMessage, RetryLater, job_event_of, run_consumer
from trainyard.bus.streams import STREAMS, ensure_streams

__all__ = [
    "STREAMS",
    "Bus",
    "ConsumerSpec",
    "PayloadTooLarge",
    "PoisonMessage",
    "job_event_of",
    "PublishDenied",
    "PublishRequest",
    "RetryLater",
    "WrongLastSequence",
    "ensure_streams",
    "run_consumer",
]
