"""Encoding and decoding, done once at the edge of every service."""

from __future__ import annotations

from typing import Any

import msgspec

from trainyard.events.jobs import IntakeCommand, JobEvent
from trainyard.events.nodes import NodeEvent

_encoder = msgspec.json.Encoder()
_intake = msgspec.json.Decoder(IntakeCommand)
_jobs = msgspec.json.Decoder(JobEvent)
_nodes = msgspec.json.Decoder(NodeEvent)


def encode(message: Any) -> bytes:
    return _encoder.encode(message)


def decode_intake(data: bytes) -> IntakeCommand:
    """Raises ``msgspec.ValidationError`` / ``DecodeError`` on bad input."""
    return _intake.decode(data)


def decode_job_event(data: bytes) -> JobEvent:
    return _jobs.decode(data)


def decode_node_event(data: bytes) -> NodeEvent:
    return _nodes.decode(data)
