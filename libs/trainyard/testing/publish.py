"""Publishing job events in tests the way their writers do."""

from __future__ import annotations

from typing import Any

from nats.js.api import PubAck

from trainyard.bus import Bus
from trainyard.events import job_subject


async def publish_event(bus: Bus, event: Any, msg_id: str, writer: str | None = None, **kwargs: Any) -> PubAck:
    """Publish a job event on its job's subject for ``writer`` (default: the
    event's usual writer)."""
    return await bus.publish(job_subject(event, writer), event, msg_id, **kwargs)
