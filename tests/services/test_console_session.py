"""The console's login and its guards, in the gateway's app against real NATS
and Redis: the session cookie is HttpOnly and SameSite=Strict, accepted on
console pages only (never the API, never a request the browser marks
cross-site), state-changing forms need the session's CSRF token, pages follow
the role policy, and the API docs and console assets are served from the
package."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

import httpx
import pytest
from gateway_fixtures import log_in
from starlette.types import ASGIApp, Message

from trainyard.bus import Bus
from trainyard.config.store import ConfigStore
from trainyard.settings import Settings
from trainyard.store import Store
from trainyard.testing.auth import Callers
from trainyard_gateway import finance_api, nodes_api
from trainyard_gateway.console import app as console_app
from trainyard_gateway.jobs import JobOperations
from trainyard_gateway.rest import create_app
from trainyard_gateway.security import CONSOLE_PREFIXES, SESSION_COOKIE, is_console_page


@pytest.fixture
def gateway_app(bus: Bus, store: Store, callers: Callers, tmp_path) -> ASGIApp:  # type: ignore[no-untyped-def]
    settings = Settings(ledger_url=f"sqlite:///{tmp_path}/ledger.db")
    ops = JobOperations(bus, store)
    routers = [
        *(module.build_router(bus, store, settings) for module in (nodes_api, finance_api)),
        console_app.build_router(ops, store, callers.authenticator, settings),
    ]
    return create_app(ops, store, callers.authenticator, routers=routers)


@pytest.fixture
async def browser(gateway_app: ASGIApp) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway_app), base_url="http://gateway") as c:
        yield c


async def test_logging_in_sets_an_httponly_samesite_strict_cookie_and_lands_on_the_roles_page(
    browser: httpx.AsyncClient, callers: Callers
) -> None:
    answer = await log_in(browser, callers.tokens["operator"])

    assert answer.status_code == 303 and answer.headers["location"] == "/"
    cookie = answer.headers["set-cookie"]
    assert f"{SESSION_COOKIE}=" in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert (await browser.get("/")).headers["location"] == "/cluster"
    assert (await browser.get("/cluster")).status_code == 200


async def test_a_token_that_does_not_verify_is_refused_on_the_login_page(browser: httpx.AsyncClient) -> None:
    answer = await log_in(browser, f"ty_0123456789abcdef_{'x' * 43}")

    assert (
        answer.status_code == 401
        and "does not verify" in answer.text
        and SESSION_COOKIE not in answer.headers.get("set-cookie", "")
    )


@pytest.mark.parametrize("path", ["/", "/jobs", "/cluster", "/usage", "/jobs/j-1"])
async def test_a_console_page_without_a_session_sends_the_person_to_the_login_page(
    browser: httpx.AsyncClient, path: str
) -> None:
    answer = await browser.get(path)

    assert answer.status_code == 303 and answer.headers["location"] == "/login"


async def test_the_session_cookie_is_not_a_credential_for_the_api(browser: httpx.AsyncClient, callers: Callers) -> None:
    await log_in(browser, callers.tokens["admin"])

    assert (await browser.get("/v1/jobs")).status_code == 401
    assert (await browser.get("/metrics")).status_code == 401
    assert (await browser.get("/jobs")).status_code == 200


async def test_a_request_the_browser_marks_cross_site_gets_no_session(
    browser: httpx.AsyncClient, callers: Callers
) -> None:
    await log_in(browser, callers.tokens["admin"])

    answer = await browser.get("/jobs", headers={"Sec-Fetch-Site": "cross-site"})

    assert answer.status_code == 303 and answer.headers["location"].startswith("/login")


async def test_a_form_that_changes_state_needs_the_sessions_csrf_token(
    browser: httpx.AsyncClient, bus: Bus, callers: Callers
) -> None:
    await log_in(browser, callers.tokens["acme"])
    form = {
        "mode": "form",
        "tenant": "acme",
        "queue": "default",
        "replicas": "1",
        "gpus_per_replica": "1",
        "duration": "5",
    }
    before = (await bus.js.stream_info("INTAKE")).state.messages

    without = await browser.post("/jobs/new", data=form)
    wrong = await browser.post("/jobs/new", data=form | {"csrf": "0" * 40})
    page = await browser.get("/jobs/new")
    token = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
    assert token
    right = await browser.post("/jobs/new", data=form | {"csrf": token.group(1), "job_id": "from-console"})

    assert without.status_code == 403 and wrong.status_code == 403 and "CSRF" in without.text
    assert right.status_code == 303 and right.headers["location"] == "/jobs/from-console?submitted=1"
    assert (await bus.js.stream_info("INTAKE")).state.messages == before + 1


async def test_a_researcher_cannot_submit_for_another_tenant_from_yaml(
    browser: httpx.AsyncClient, callers: Callers
) -> None:
    await log_in(browser, callers.tokens["acme"])
    csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', (await browser.get("/jobs/new")).text)
    assert csrf
    spec = "tenant: globex\nqueue: default\nroles:\n  - name: t\n    gpus_per_replica: 1\nsimulated_duration_s: 1\n"

    answer = await browser.post("/jobs/new", data={"mode": "yaml", "yaml": spec, "csrf": csrf.group(1)})

    assert answer.status_code == 403 and "acts only for tenant" in answer.text


async def test_a_yaml_spec_whose_aliases_expand_without_bound_is_refused_on_the_form(
    browser: httpx.AsyncClient, callers: Callers, bus: Bus
) -> None:
    await log_in(browser, callers.tokens["acme"])
    csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', (await browser.get("/jobs/new")).text)
    assert csrf
    lines = ['l0: &l0 ["x","x","x","x","x","x","x","x","x","x"]']
    lines += [f"l{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, 9)]
    spec = "tenant: acme\nqueue: default\n" + "\n".join(lines) + "\nlabels: *l8\n"  # 10**9 strings
    before = (await bus.js.stream_info("INTAKE")).state.messages

    answer = await browser.post("/jobs/new", data={"mode": "yaml", "yaml": spec, "csrf": csrf.group(1)})

    assert answer.status_code == 422 and "expands to more than 100,000 values" in answer.text
    assert (await bus.js.stream_info("INTAKE")).state.messages == before


@pytest.mark.parametrize(
    ("caller", "allowed", "refused"),
    [
        pytest.param(
            "acme",
            ["/jobs", "/jobs/new", "/cluster", "/nodes", "/usage"],
            ["/finance/capacity", "/nodes/n01", "/finance/chargeback"],
            id="researcher",
        ),
        pytest.param(
            "operator",
            ["/jobs", "/cluster"],
            ["/jobs/new", "/usage", "/finance/capacity", "/finance/chargeback"],
            id="operator",
        ),
        pytest.param(
            "finance",
            ["/cluster", "/nodes", "/usage", "/finance/capacity", "/finance/chargeback"],
            ["/jobs", "/jobs/new", "/nodes/n01"],
            id="finance",
        ),
    ],
)
async def test_each_role_sees_only_the_pages_its_role_may_use(
    browser: httpx.AsyncClient, callers: Callers, caller: str, allowed: list[str], refused: list[str]
) -> None:
    await log_in(browser, callers.tokens[caller])

    for path in allowed:
        assert (await browser.get(path)).status_code == 200, path
    for path in refused:
        assert (await browser.get(path)).status_code == 403, path


async def test_the_tenancy_page_of_a_stack_with_no_tenancy_applied_says_so(
    browser: httpx.AsyncClient, callers: Callers, bus: Bus
) -> None:
    await ConfigStore.open(bus)  # what every service does at start: the bucket, with no revision in it yet
    await log_in(browser, callers.tokens["admin"])

    answer = await browser.get("/admin/tenancy")

    assert answer.status_code == 200 and "No tenancy configuration has been applied" in answer.text


async def test_logging_out_needs_the_csrf_token_and_clears_the_cookie(
    browser: httpx.AsyncClient, callers: Callers
) -> None:
    await log_in(browser, callers.tokens["admin"])
    csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', (await browser.get("/jobs")).text)
    assert csrf

    assert (await browser.post("/logout", data={})).status_code == 403
    answer = await browser.post("/logout", data={"csrf": csrf.group(1)})

    assert answer.status_code == 303 and answer.headers["location"] == "/login"
    assert (await browser.get("/jobs")).status_code == 303


async def test_the_api_docs_and_the_console_assets_come_from_the_package(browser: httpx.AsyncClient) -> None:
    docs = await browser.get("/docs")
    assets = [await browser.get(p) for p in re.findall(r'(?:src|href)="(/static/[^"]+)"', docs.text)]
    login = await browser.get("/login")
    console_assets = [await browser.get(p) for p in re.findall(r'(?:src|href)="(/static/[^"]+)"', login.text)]

    assert docs.status_code == 200 and "http" not in "".join(re.findall(r'(?:src|href)="([^"]+)"', docs.text))
    assert len(assets) == 3 and all(a.status_code == 200 and a.content for a in assets)
    assert len(console_assets) >= 4 and all(a.status_code == 200 for a in console_assets)
    assert (await browser.get("/redoc")).status_code in (303, 401, 404)


def test_every_console_route_is_a_page_the_session_cookie_may_open() -> None:
    def paths_of(routes: list) -> set[str]:  # type: ignore[type-arg]
        found: set[str] = set()
        for route in routes:
            inner = getattr(route, "original_router", None)  # an included router
            found |= paths_of(inner.routes) if inner is not None else {route.path}
        return found

    paths = paths_of(console_app.build_router(JobOperations(None, None), None, None, Settings(ledger_url="")).routes)  # type: ignore[arg-type]

    assert {"/", "/jobs", "/cluster", "/usage", "/finance/chargeback", "/login", "/logout"} <= paths
    assert [p for p in paths if p != "/login" and not is_console_page(p.split("{")[0].rstrip("/") or "/")] == []
    assert not any(p.startswith("/v1") for p in CONSOLE_PREFIXES)


@pytest.mark.parametrize("path", ["/jobs/stream", "/cluster/stream", "/jobs/j-1/stream"])
async def test_a_live_stream_ends_once_the_sessions_token_is_revoked(
    gateway_app: ASGIApp, callers: Callers, path: str
) -> None:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway_app), base_url="http://gateway") as c:
        await log_in(c, callers.tokens["operator"])
        session = c.cookies[SESSION_COOKIE]
    # Driven as the server would drive it: httpx's ASGI transport waits for a response to end.
    sent: asyncio.Queue[Message] = asyncio.Queue()
    asked = False
    gone = asyncio.Event()

    async def receive() -> Message:
        nonlocal asked
        if not asked:
            asked = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    headers = [
        (b"host", b"gateway"),
        (b"accept", b"text/event-stream"),
        (b"cookie", f"{SESSION_COOKIE}={session}".encode()),
    ]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("gateway", 80),
    }
    serving = asyncio.create_task(gateway_app(scope, receive, sent.put))
    try:
        start = await asyncio.wait_for(sent.get(), 30)
        assert start["type"] == "http.response.start" and start["status"] == 200
        assert b"live" in (await asyncio.wait_for(sent.get(), 30))["body"]

        await callers.store.revoke(callers.ids["operator"], revoked_by="test")

        async def last_part() -> Message:
            while True:
                message = await sent.get()
                if message["type"] == "http.response.body" and not message.get("more_body", False):
                    return message

        # It ends within a poll or two; left alone it would read on for STREAM_LIFETIME_S (5 minutes).
        await asyncio.wait_for(last_part(), 30)
        await asyncio.wait_for(serving, 30)
    finally:
        gone.set()
        serving.cancel()
