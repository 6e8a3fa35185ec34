"""Encoding and decoding, done once at the edge of every service."""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from trainyard.events.jobs import IntakeCommand, JobEvent
from trainyard.events.nodes import NodeEvent

T = TypeVar("T")

_encoder = msgspec.json.Encoder()
_intake: msgspec.json.Decoder[IntakeCommand] = msgspec.json.Decoder(IntakeCommand)
_jobs: msgspec.json.Decoder[JobEvent] = msgspec.json.Decoder(JobEvent)
_nodes: msgspec.json.Decoder[NodeEvent] = msgspec.json.Decoder(NodeEvent)


def encode(message: Any) -> bytes:
    return _encoder.encode(message)


def _decode(decoder: msgspec.json.Decoder[T], data: bytes) -> T:
    """JSON nested deeper than the interpreter's recursion limit (even in a
    field that is ignored) is bad input like any other: a ``DecodeError``."""
    try:
        return decoder.decode(data)
    except RecursionError as err:
        raise msgspec.DecodeError("JSON is nested too deeply") from err


def decode_intake(data: bytes) -> IntakeCommand:
    """Raises ``msgspec.ValidationError`` / ``DecodeError`` on bad input."""
    return _decode(_intake, data)


def decode_job_event(data: bytes) -> JobEvent:
    return _decode(_jobs, data)


def decode_node_event(data: bytes) -> NodeEvent:
    return _decode(_nodes, data)
