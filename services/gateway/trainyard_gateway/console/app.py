"""The console's routes, mounted on the gateway's app (see
``trainyard_gateway.main``): login and logout, home, jobs, the cluster map, the
nodes list and each node, usage, chargeback and capacity.  None is part of the OpenAPI document:
they are pages for people, not the API."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from trainyard.auth import Authenticator, Role
from trainyard.settings import Settings
from trainyard.store import Store
from trainyard_gateway.console import admin, cluster, deadletters, finance, jobs, nodes, session, tokens
from trainyard_gateway.finance_api import ledger_opener
from trainyard_gateway.jobs import JobOperations

#: Where each role lands after logging in: the page it came for.
HOME = {
    Role.RESEARCHER: "/jobs",
    Role.TENANT_ADMIN: "/jobs",
    Role.OPERATOR: "/cluster",
    Role.FINANCE: "/usage",
    Role.ADMIN: "/jobs",
}


def build_router(ops: JobOperations, store: Store, auth: Authenticator, settings: Settings) -> APIRouter:
    router = APIRouter(include_in_schema=False)
    ledger = ledger_opener(settings) if settings.ledger_url else None

    @router.get("/")
    async def home(request: Request) -> Response:
        return RedirectResponse(HOME[session.principal(request).role], status_code=303)

    router.include_router(session.build_router(auth))
    router.include_router(jobs.build_router(ops, ledger))
    router.include_router(cluster.build_router(ops.bus, store))
    router.include_router(nodes.build_router(ops.bus, store))
    router.include_router(finance.build_router(ops.bus, store, ledger, ops.nodes_caught_up))
    router.include_router(admin.build_router(ops.bus, store))
    router.include_router(tokens.build_router(ops.bus, getattr(auth, "tokens", None)))  # None: no token store
    router.include_router(deadletters.build_router(ops.bus))
    return router
