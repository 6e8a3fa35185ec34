"""Console pages for nodes: the list of every node (filterable by state, with
its GPUs), a node's detail with its health history, and the cordon / drain /
uncordon commands (operators and admins, as in the API).

Only the commands the node's state machine accepts in its current state are
offered, and each asks to be confirmed on a page of its own before it is
sent: the first POST (with the reason) answers the confirmation form, whose
POST, carrying ``confirm=yes`` and the CSRF token again, sends the command.
No script is needed."""

from __future__ import annotations

import time
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from trainyard.auth import Action, PermissionDenied, authorize
from trainyard.bus import Bus
from trainyard.core.health import Cordon, Drain, NodeHealthRecord, TransitionRejected, Uncordon, transition
from trainyard.store import Store, views
from trainyard.store.caught_up import CaughtUpReads
from trainyard_gateway.console.cluster import NODE_STATES, SCHEDULABLE, FleetReader, palette_for, summary
from trainyard_gateway.console.palette import HEALTH, tenancy_tenants
from trainyard_gateway.console.rebuilding import answers_rebuilding
from trainyard_gateway.console.render import may, page
from trainyard_gateway.console.session import Forbidden, principal, read_form, refusal
from trainyard_gateway.nodes_api import MAX_REASON_CHARS, NODE_ID_RE, NodeCommandRefused, health_record, node_command

#: op -> (the command for the state machine, what the operator is told it does)
OPS: dict[str, tuple[type[Cordon] | type[Drain] | type[Uncordon], str]] = {
    "cordon": (Cordon, "stops new work landing on it; its runs keep running"),
    "drain": (Drain, "stops new work and moves its runs elsewhere"),
    "uncordon": (Uncordon, "returns it to service"),
}


def refused_because(record: NodeHealthRecord, op: str, now: float) -> str | None:
    """Why the state machine would refuse ``op`` on the node now; None when it accepts it."""
    command = OPS[op][0](node_id=record.node_id, by="operator:console", reason="check")
    _, actions = transition(record, command, now)
    return next((a.reason for a in actions if isinstance(a, TransitionRejected)), None)


def valid_ops(record: NodeHealthRecord, now: float) -> list[str]:
    """The commands that apply to the node in its current state."""
    return [op for op in OPS if refused_because(record, op, now) is None]


def build_router(bus: Bus, store: Store) -> APIRouter:
    router = APIRouter(include_in_schema=False)
    caught_up = CaughtUpReads(bus, store, streams=("NODES", "JOBS"))

    @router.get("/nodes")
    @answers_rebuilding
    async def nodes_page(request: Request, state: str = "") -> Response:
        who = principal(request)
        if (refused := refusal(request, who, Action.NODE_LIST)) is not None:
            return refused
        if state and state not in NODE_STATES:
            message = f"{state[:40]!r} is not a node state; use one of: {', '.join(NODE_STATES)}"
            return page(request, "error.html", who, status_code=422, message=message)
        tiles = await FleetReader(store, caught_up).tiles()
        return page(
            request,
            "nodes.html",
            who,
            tiles=[t for t in tiles if not state or t.state == state],
            summary=summary(tiles),
            state=state,
            health=HEALTH,
            schedulable=SCHEDULABLE,
            link=may(who, Action.NODE_HISTORY),
        )

    @router.get("/nodes/{node_id}")
    @answers_rebuilding
    async def node_page(request: Request, node_id: str, done: str = "", error: str = "") -> Response:
        who = principal(request)
        if (refused := refusal(request, who, Action.NODE_HISTORY)) is not None:
            return refused
        record = await caught_up.read(lambda: health_record(store, node_id)) if NODE_ID_RE.fullmatch(node_id) else None
        if record is None:
            return page(request, "error.html", who, status_code=404, message=f"no node {node_id!r}")
        tile = next(iter(await FleetReader(store, caught_up).tiles(only=node_id)), None)
        runs = await caught_up.read(lambda: views.jobs_on_node(store, node_id))
        return page(
            request,
            "node.html",
            who,
            node_id=node_id,
            record=record,
            tile=tile,
            runs=runs,
            ops={op: OPS[op][1] for op in valid_ops(record, time.time())},
            palette=palette_for(await tenancy_tenants(bus), [tile] if tile else []),
            link=False,
            done=done[:300],
            error=error[:300],
            history=list(reversed(record.history)),
        )

    @router.post("/nodes/{node_id}/{op}")
    async def node_op(request: Request, node_id: str, op: str) -> Response:
        who = principal(request)
        if op not in OPS or not NODE_ID_RE.fullmatch(node_id):
            return page(request, "error.html", who, status_code=404, message="no such page")
        try:
            fields = await read_form(request)
            authorize(who, Action.NODE_OPERATE)
        except (Forbidden, PermissionDenied) as err:
            return page(request, "error.html", who, status_code=403, message=str(err))
        reason = fields.get("reason", "").strip()
        if not 0 < len(reason) <= MAX_REASON_CHARS:
            problem = f"give a reason (1-{MAX_REASON_CHARS} characters)"
            return RedirectResponse(f"/nodes/{node_id}?{urlencode({'error': problem})}", 303)
        if fields.get("confirm") != "yes":
            record = await health_record(store, node_id)
            if record is None:
                return page(request, "error.html", who, status_code=404, message=f"no node {node_id!r}")
            if (why := refused_because(record, op, time.time())) is not None:
                problem = f"cannot {op} {node_id} ({record.state.value}): {why}"
                return RedirectResponse(f"/nodes/{node_id}?{urlencode({'error': problem})}", 303)
            return page(
                request,
                "node_confirm.html",
                who,
                node_id=node_id,
                op=op,
                effect=OPS[op][1],
                reason=reason,
                record=record,
            )
        try:
            accepted = await node_command(bus, store, op, node_id, reason, who)
        except NodeCommandRefused as err:
            return page(request, "error.html", who, status_code=err.status, message=str(err))
        message = f"{op} accepted: {node_id} goes from {accepted.state} to {accepted.expected_state}"
        return RedirectResponse(f"/nodes/{node_id}?{urlencode({'done': message})}", 303)

    return router
