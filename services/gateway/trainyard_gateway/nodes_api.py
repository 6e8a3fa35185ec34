"""REST routes for node operations: cordon, drain, uncordon, history.

``POST /v1/nodes/{node_id}/cordon|drain|uncordon`` with ``{"reason": "..."}``
checks the command against the node's health record (a command that does not
apply is refused with 409 and the reason), publishes it on the NODES stream
for the health service to carry out, and records it in the audit stream under
the verified caller.  The answer (202) names the state the node is expected to
reach; ``GET /v1/nodes`` shows it once health has moved the node.

``GET /v1/nodes/{node_id}/history`` returns health's record of the node: its
state, why, the current incident and the bounded history of transitions.

Both are for the operator and admin roles (403 for the others).
"""

from __future__ import annotations

import re
import time
import uuid

import msgspec
from fastapi import APIRouter, Request
from fastapi.responses import Response

from trainyard.auth import Action, Principal
from trainyard.bus import Bus
from trainyard.bus.audit import audit
from trainyard.core.health import Cordon, Drain, NodeHealthRecord, TransitionRejected, Uncordon, transition
from trainyard.domain.job import ValidationError
from trainyard.domain.node import NodeState
from trainyard.events import subjects
from trainyard.events.nodes import CordonNode, DrainNode, UncordonNode
from trainyard.settings import Settings
from trainyard.store import Store
from trainyard.store.node_records import NodeRecords
from trainyard_gateway.errors import error_response, json_response
from trainyard_gateway.jobs import InvalidRequest
from trainyard_gateway.schema import NodeCommandAccepted, NodeCommandBody, NodeHistory
from trainyard_gateway.security import allow, read_body

MAX_REASON_CHARS = 256
MAX_BODY_BYTES = 4096
NODE_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")  # a subject token; fullmatch, so no final newline

#: op -> (command for the health core, event published for the health service)
_OPS = {"cordon": (Cordon, CordonNode), "drain": (Drain, DrainNode), "uncordon": (Uncordon, UncordonNode)}


async def health_record(store: Store, node_id: str) -> NodeHealthRecord | None:
    """Health's record of the node (kept by the health service in ``health:rec``);
    a registered node health has not judged yet starts from its projected state."""
    raw, state, info = await _reads(store, node_id)
    if info is None:
        return None
    if raw:
        return NodeRecords.decode(raw)
    try:
        projected = NodeState(state) if state else NodeState.HEALTHY
    except ValueError:
        projected = NodeState.HEALTHY
    return NodeHealthRecord(node_id=node_id, state=projected)


async def _reads(store: Store, node_id: str) -> tuple[str | None, str | None, str | None]:
    pipe = store.redis.pipeline(transaction=False)
    pipe.hget(NodeRecords(store).key, node_id)
    pipe.hget(store.key("nodestate"), node_id)
    pipe.hget(store.key("nodeinfo"), node_id)
    raw, state, info = await pipe.execute()
    return raw, state, info


def check_node_id(node_id: str) -> None:
    if not NODE_ID_RE.fullmatch(node_id):
        message = f"{node_id!r} is not a node id: use 1-64 letters, digits, '_' or '-'"
        raise InvalidRequest([ValidationError("node_id", message)])


class NodeCommandRefused(Exception):
    """The command does not apply: ``status`` 404 (no such node) or 409 (the
    state machine refuses it), with the reason as the message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def node_command(
    bus: Bus, store: Store, op: str, node_id: str, reason: str, who: Principal
) -> NodeCommandAccepted:
    """Cordon, drain or uncordon ``node_id`` for ``who`` (REST and the console):
    checked against health's record, published for health, audited."""
    by = f"operator:{who.actor}"  # health takes "operator:" as a person's command
    record = await health_record(store, node_id)
    if record is None:
        raise NodeCommandRefused(404, f"no node {node_id!r}")
    info_raw = await store.redis.hget(store.key("nodeinfo"), node_id)
    cluster = msgspec.json.decode(info_raw)["cluster"]
    core_command, event_type = _OPS[op]
    now = time.time()
    # 1. Refuse what the state machine would refuse, with its reason.
    after, actions = transition(record, core_command(node_id=node_id, by=by, reason=reason), now)
    rejected = [a for a in actions if isinstance(a, TransitionRejected)]
    if rejected:
        raise NodeCommandRefused(409, f"cannot {op} {node_id}: {rejected[0].reason}")
    # 2. Publish the command for health, and audit it.
    command_id = uuid.uuid4().hex
    event = event_type(at=now, node_id=node_id, cluster=cluster, by=by, reason=reason)
    await bus.publish(subjects.node(cluster, node_id), event, msg_id=f"cmd:{op}:{node_id}:{command_id}")
    await audit(bus, who.actor, f"node.{op}", node_id, reason, at=now, record_id=f"audit:cmd:{command_id}")
    return NodeCommandAccepted(node_id=node_id, command=op, state=record.state.value, expected_state=after.state.value)


def build_router(bus: Bus, store: Store, settings: Settings) -> APIRouter:
    router = APIRouter(prefix="/v1/nodes", tags=["nodes"])

    async def command(op: str, node_id: str, request: Request, who: Principal) -> Response:
        check_node_id(node_id)
        try:
            body = msgspec.json.decode(await read_body(request, MAX_BODY_BYTES) or b"{}", type=NodeCommandBody)
        except msgspec.ValidationError as err:
            return error_response(422, "invalid_argument", f"bad body: {err}")
        except (msgspec.DecodeError, RecursionError) as err:
            return error_response(422, "invalid_argument", f"the body is not a JSON object with a reason: {err}")
        reason = body.reason.strip()
        if not 0 < len(reason) <= MAX_REASON_CHARS:
            return error_response(422, "invalid_argument", f"reason: give 1-{MAX_REASON_CHARS} characters")
        try:
            accepted = await node_command(bus, store, op, node_id, reason, who)
        except NodeCommandRefused as err:
            return error_response(err.status, "not_found" if err.status == 404 else "conflict", str(err))
        return json_response(accepted, 202)

    @router.post("/{node_id}/cordon", status_code=202, summary="Stop placing new work on a node")
    async def cordon(node_id: str, request: Request, who: Principal = allow(Action.NODE_OPERATE)) -> Response:
        return await command("cordon", node_id, request, who)

    @router.post("/{node_id}/drain", status_code=202, summary="Cordon a node and move its runs elsewhere")
    async def drain(node_id: str, request: Request, who: Principal = allow(Action.NODE_OPERATE)) -> Response:
        return await command("drain", node_id, request, who)

    @router.post("/{node_id}/uncordon", status_code=202, summary="Return a node to service")
    async def uncordon(node_id: str, request: Request, who: Principal = allow(Action.NODE_OPERATE)) -> Response:
        return await command("uncordon", node_id, request, who)

    @router.get("/{node_id}/history", summary="A node's health state, incident and history of transitions")
    async def history(node_id: str, who: Principal = allow(Action.NODE_HISTORY)) -> Response:
        check_node_id(node_id)
        record = await health_record(store, node_id)
        if record is None:
            return error_response(404, "not_found", f"no node {node_id!r}")
        return json_response(
            NodeHistory(
                node_id=node_id,
                state=record.state.value,
                reason=record.reason,
                since=record.since,
                remedy=record.remedy.value if record.remedy else None,
                gpus=list(record.gpus),
                cordoned_by=record.cordoned_by,
                lemon=record.lemon,
                incidents=list(record.incidents),
                history=list(record.history),
            )
        )

    return router
