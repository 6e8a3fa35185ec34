"""REST routes for node operations: cordon, drain, uncordon, history.

``POST /v1/nodes/{node_id}/cordon|drain|uncordon`` with ``{"reason": "...",
"operator": "alice"}`` checks the command against the node's health record
(a command that does not apply is refused with 409 and the reason), publishes
it on the NODES stream for the health service to carry out, and records it in
the audit stream.  The answer (202) names the state the node is expected to
reach; ``GET /v1/nodes`` shows it once health has moved the node.

``GET /v1/nodes/{node_id}/history`` returns health's record of the node: its
state, why, the current incident and the bounded history of transitions.

Tenant-scoped callers (``X-Trainyard-Tenant``) may not operate on nodes (403).
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated

import msgspec
from fastapi import APIRouter, Header, Request
from fastapi.responses import Response

from trainyard.api.rest import TENANT_HEADER, error_response, json_response
from trainyard.bus import Bus
from trainyard.bus.audit import audit
from trainyard.core.health import Cordon, Drain, HistoryEntry, NodeHealthRecord, TransitionRejected, Uncordon, transition
from trainyard.domain.node import NodeState
from trainyard.events import subjects
from trainyard.events.nodes import CordonNode, DrainNode, UncordonNode
from trainyard.settings import Settings
from trainyard.store import Store

MAX_REASON_CHARS = 256
OPERATOR_HEADER = "X-Trainyard-Operator"

_record = msgspec.json.Decoder(NodeHealthRecord)

Tenant = Annotated[str | None, Header(alias=TENANT_HEADER)]
Operator = Annotated[str | None, Header(alias=OPERATOR_HEADER)]

#: op -> (command for the health core, event published for the health service)
_OPS = {"cordon": (Cordon, CordonNode), "drain": (Drain, DrainNode), "uncordon": (Uncordon, UncordonNode)}


class NodeCommandBody(msgspec.Struct, frozen=True):
    reason: str
    operator: str | None = None  # defaults to the X-Trainyard-Operator header, else "unknown"


class NodeCommandAccepted(msgspec.Struct):
    node_id: str
    command: str
    state: str  # the node's state now
    expected_state: str  # the state health will move it to
    status: str = "accepted"


class NodeHistory(msgspec.Struct):
    node_id: str
    state: str
    reason: str
    since: float
    remedy: str | None
    gpus: list[int]
    cordoned_by: str | None
    lemon: bool
    incidents: list[float]
    history: list[HistoryEntry]


async def health_record(store: Store, node_id: str) -> NodeHealthRecord | None:
    """Health's record of the node (kept by the health service in ``health:rec``);
    a registered node health has not judged yet starts from its projected state."""
    raw, state, info = await _reads(store, node_id)
    if info is None:
        return None
    if raw:
        return _record.decode(raw)
    try:
        projected = NodeState(state) if state else NodeState.HEALTHY
    except ValueError:
        projected = NodeState.HEALTHY
    return NodeHealthRecord(node_id=node_id, state=projected)


async def _reads(store: Store, node_id: str) -> tuple[str | None, str | None, str | None]:
    pipe = store.redis.pipeline(transaction=False)
    pipe.hget(store.key("health", "rec"), node_id)
    pipe.hget(store.key("nodestate"), node_id)
    pipe.hget(store.key("nodeinfo"), node_id)
    raw, state, info = await pipe.execute()
    return raw, state, info


def build_router(bus: Bus, store: Store, settings: Settings) -> APIRouter:
    router = APIRouter(prefix="/v1/nodes", tags=["nodes"])

    async def command(
        op: str, node_id: str, request: Request, tenant: str | None, operator_header: str | None
    ) -> Response:
        if tenant is not None:
            return error_response(403, "permission_denied", "node operations are for operators, not tenants")
        try:
            body = msgspec.json.decode(await request.body() or b"{}", type=NodeCommandBody)
        except msgspec.ValidationError as err:
            return error_response(422, "invalid_argument", f"bad body: {err}")
        except msgspec.DecodeError as err:
            return error_response(422, "invalid_argument", f"the body is not JSON: {err}")
        reason = body.reason.strip()
        if not 0 < len(reason) <= MAX_REASON_CHARS:
            return error_response(422, "invalid_argument", f"reason: give 1-{MAX_REASON_CHARS} characters")
        operator = (body.operator or operator_header or "unknown").strip() or "unknown"
        by = f"operator:{operator}"
        record = await health_record(store, node_id)
        if record is None:
            return error_response(404, "not_found", f"no node {node_id!r}")
        info_raw = await store.redis.hget(store.key("nodeinfo"), node_id)
        cluster = msgspec.json.decode(info_raw)["cluster"]
        core_command, event_type = _OPS[op]
        now = time.time()
        # 1. Refuse what the state machine would refuse, with its reason.
        after, actions = transition(record, core_command(node_id=node_id, by=by, reason=reason), now)
        rejected = [a for a in actions if isinstance(a, TransitionRejected)]
        if rejected:
            return error_response(409, "conflict", f"cannot {op} {node_id}: {rejected[0].reason}")
        # 2. Publish the command for health, and audit it.
        command_id = uuid.uuid4().hex
        event = event_type(at=now, node_id=node_id, cluster=cluster, by=by, reason=reason)
        await bus.publish(subjects.node(cluster, node_id), event, msg_id=f"cmd:{op}:{node_id}:{command_id}")
        await audit(bus, by, f"node.{op}", node_id, reason, at=now, record_id=f"audit:cmd:{command_id}")
        accepted = NodeCommandAccepted(node_id=node_id, command=op, state=record.state.value, expected_state=after.state.value)
        return json_response(accepted, 202)

    @router.post("/{node_id}/cordon", status_code=202, summary="Stop placing new work on a node")
    async def cordon(node_id: str, request: Request, tenant: Tenant = None, operator: Operator = None) -> Response:
        return await command("cordon", node_id, request, tenant, operator)

    @router.post("/{node_id}/drain", status_code=202, summary="Cordon a node and move its runs elsewhere")
    async def drain(node_id: str, request: Request, tenant: Tenant = None, operator: Operator = None) -> Response:
        return await command("drain", node_id, request, tenant, operator)

    @router.post("/{node_id}/uncordon", status_code=202, summary="Return a node to service")
    async def uncordon(node_id: str, request: Request, tenant: Tenant = None, operator: Operator = None) -> Response:
        return await command("uncordon", node_id, request, tenant, operator)

    @router.get("/{node_id}/history", summary="A node's health state, incident and history of transitions")
    async def history(node_id: str, tenant: Tenant = None) -> Response:
        if tenant is not None:
            return error_response(403, "permission_denied", "node history is for operators, not tenants")
        record = await health_record(store, node_id)
        if record is None:
            return error_response(404, "not_found", f"no node {node_id!r}")
        return json_response(
            NodeHistory(
                node_id=node_id, state=record.state.value, reason=record.reason, since=record.since,
                remedy=record.remedy.value if record.remedy else None, gpus=list(record.gpus),
                cordoned_by=record.cordoned_by, lemon=record.lemon, incidents=list(record.incidents),
                history=list(record.history),
            )  # fmt: skip
        )

    return router
