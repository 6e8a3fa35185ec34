"""The audit trail: every human or automatic action that changes state."""

from __future__ import annotations

import time
import uuid

import msgspec

from trainyard.bus.connection import Bus
from trainyard.events import subjects


class AuditRecord(msgspec.Struct, frozen=True, kw_only=True):
    at: float
    actor: str  # "operator:<name>", "service:health", ...
    action: str  # "node.cordon", "config.apply", ...
    target: str  # what it acted on: a node id, a config version, a job id
    reason: str = ""
    details: dict[str, str] = {}


async def audit(
    bus: Bus,
    actor: str,
    action: str,
    target: str,
    reason: str = "",
    details: dict[str, str] | None = None,
    at: float | None = None,
    record_id: str | None = None,
) -> None:
    """Publish one audit record on ``trainyard.audit.<action's first word>``.

    ``record_id`` makes a retried action one record (it is the message id)."""
    record = AuditRecord(
        at=time.time() if at is None else at,
        actor=actor,
        action=action,
        target=target,
        reason=reason,
        details=details or {},
    )
    kind = action.split(".", 1)[0]
    await bus.publish(subjects.audit(kind), record, msg_id=record_id or f"audit:{uuid.uuid4().hex}")
