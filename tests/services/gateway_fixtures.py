"""The gateway's whole app (REST, node and finance routes, the console) on
real NATS and Redis, for tests that drive it as a client or a browser would."""

from __future__ import annotations

import re

import httpx
from starlette.types import ASGIApp

from trainyard.auth import Authenticator
from trainyard.bus import Bus
from trainyard.settings import Settings
from trainyard.store import Store
from trainyard_gateway import dlq_api, finance_api, nodes_api
from trainyard_gateway.console import app as console_app
from trainyard_gateway.jobs import JobOperations
from trainyard_gateway.main import build_usage_source
from trainyard_gateway.rest import create_app


def gateway_app(bus: Bus, store: Store, auth: Authenticator, settings: Settings) -> ASGIApp:
    """The app ``trainyard_gateway.main`` serves, every router included."""
    ops = JobOperations(bus, store)
    routers = [
        *(module.build_router(bus, store, settings) for module in (nodes_api, finance_api)),
        console_app.build_router(ops, store, auth, settings),
        dlq_api.build_router(bus, store, settings),
    ]
    return create_app(ops, store, auth, usage_source=build_usage_source(settings), routers=routers)


def client(app: ASGIApp) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway")


def csrf_of(html: str) -> str:
    """The CSRF token a console page's forms carry."""
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found, "the page has no CSRF token"
    return found.group(1)


async def log_in(browser: httpx.AsyncClient, token: str) -> httpx.Response:
    """Log in as a person does: read the login page (its form's CSRF token), then send the token."""
    page = await browser.get("/login")
    return await browser.post("/login", data={"token": token, "csrf": csrf_of(page.text)})
