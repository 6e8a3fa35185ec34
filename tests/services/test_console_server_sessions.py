"""Console sessions live on the server: the cookie is a session id and secret,
never the API token; logging out, the 12-hour lifetime and the token's
revocation end it on the server (a copied cookie stops working); the login
form needs its CSRF token; every response carries the anti-framing and other
security headers; unknown credential ids do not cost a NATS look-up each."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from gateway_fixtures import client, csrf_of, gateway_app, log_in
from starlette.types import ASGIApp

from trainyard.auth import Authenticator, JwtVerifier, TokenStore, Unauthenticated, jwt_config
from trainyard.bus import Bus
from trainyard.settings import Settings
from trainyard.store import Store
from trainyard.testing.auth import Callers
from trainyard.testing.locked_bus import locked_bus
from trainyard_gateway.security import LOGIN_COOKIE, SESSION_COOKIE


@pytest.fixture
def auth(callers: Callers) -> Authenticator:
    return callers.authenticator


@pytest.fixture
def app(bus: Bus, store: Store, auth: Authenticator, tmp_path: Any) -> ASGIApp:
    return gateway_app(bus, store, auth, Settings(ledger_url=f"sqlite:///{tmp_path}/ledger.db"))


@pytest.fixture
async def browser(app: ASGIApp) -> AsyncIterator[httpx.AsyncClient]:
    async with client(app) as c:
        yield c


async def copy_of(app: ASGIApp, browser: httpx.AsyncClient) -> httpx.AsyncClient:
    """Another client holding the same session cookie (as a thief would)."""
    other = client(app)
    other.headers["cookie"] = f"{SESSION_COOKIE}={browser.cookies[SESSION_COOKIE]}"
    return other


async def test_the_session_cookie_is_a_server_session_not_the_api_token(
    browser: httpx.AsyncClient, callers: Callers
) -> None:
    answer = await log_in(browser, callers.tokens["operator"])

    cookie = browser.cookies[SESSION_COOKIE]
    assert answer.status_code == 303 and cookie.startswith("tys_")
    assert callers.tokens["operator"] not in answer.headers["set-cookie"]
    assert (await browser.get("/cluster")).status_code == 200


async def test_logging_out_ends_the_session_on_the_server_for_every_copy_of_the_cookie(
    app: ASGIApp, browser: httpx.AsyncClient, callers: Callers
) -> None:
    await log_in(browser, callers.tokens["admin"])
    async with await copy_of(app, browser) as thief:
        assert (await thief.get("/jobs")).status_code == 200
        csrf = csrf_of((await browser.get("/jobs")).text)

        assert (await browser.post("/logout", data={"csrf": csrf})).status_code == 303

        answer = await thief.get("/jobs")
        assert answer.status_code == 303 and answer.headers["location"] == "/login?expired=1"


async def test_a_session_past_its_twelve_hours_is_refused_by_the_server(
    app: ASGIApp, browser: httpx.AsyncClient, callers: Callers, auth: Authenticator
) -> None:
    await log_in(browser, callers.tokens["admin"])
    assert auth.sessions is not None
    auth.sessions.clock = lambda: time.time() + 12 * 3600 + 1  # the browser would still send the cookie

    async with await copy_of(app, browser) as kept:
        answer = await kept.get("/jobs")

    assert answer.status_code == 303 and answer.headers["location"] == "/login?expired=1"
    with pytest.raises(Unauthenticated, match="expired"):
        await auth.session(browser.cookies[SESSION_COOKIE])


async def test_revoking_the_token_ends_the_sessions_started_with_it(
    browser: httpx.AsyncClient, callers: Callers
) -> None:
    await log_in(browser, callers.tokens["acme"])
    assert (await browser.get("/jobs")).status_code == 200

    await callers.store.revoke(callers.ids["acme"], revoked_by="test")

    assert (await browser.get("/jobs")).status_code == 303


async def test_the_login_form_needs_its_csrf_token_and_the_login_cookie(
    app: ASGIApp, browser: httpx.AsyncClient, callers: Callers
) -> None:
    token = callers.tokens["admin"]
    without = await browser.post("/login", data={"token": token})
    page = await browser.get("/login")
    forged = await browser.post("/login", data={"token": token, "csrf": "0" * 40})
    async with client(app) as other:  # a token from another browser's login page
        elsewhere = await other.post("/login", data={"token": token, "csrf": csrf_of(page.text)})

    for refused in (without, forged, elsewhere):
        assert refused.status_code == 403 and "CSRF" in refused.text
        assert SESSION_COOKIE not in refused.headers.get("set-cookie", "")
    assert LOGIN_COOKIE in page.headers["set-cookie"] and "HttpOnly" in page.headers["set-cookie"]
    assert (await browser.post("/login", data={"token": token, "csrf": csrf_of(page.text)})).status_code == 303


@pytest.mark.parametrize("path", ["/login", "/jobs", "/v1/jobs", "/healthz", "/docs"])
async def test_every_response_forbids_framing_and_sniffing_and_sends_no_referrer(
    browser: httpx.AsyncClient, path: str
) -> None:
    answer = await browser.get(path)

    assert answer.headers["x-frame-options"] == "DENY"
    assert "frame-ancestors 'none'" in answer.headers["content-security-policy"]
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert answer.headers["referrer-policy"] == "no-referrer"


class CountingBucket:
    """The real KV bucket, counting the reads made of it."""

    def __init__(self, kv: Any) -> None:
        self.kv = kv
        self.gets = 0

    async def get(self, key: str) -> Any:
        self.gets += 1
        return await self.kv.get(key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kv, name)


async def test_unknown_token_and_session_ids_cost_a_bounded_number_of_nats_look_ups(bus: Bus, callers: Callers) -> None:
    bucket = CountingBucket((await TokenStore.open(bus.js)).kv)
    auth = Authenticator(TokenStore(bucket))  # type: ignore[arg-type]
    assert auth.sessions is not None
    ids = [f"{n:016x}" for n in range(200)]

    for token_id in ids:
        with pytest.raises(Unauthenticated):
            await auth.authenticate(f"Bearer ty_{token_id}_{'x' * 43}")
    for session_id in ids:
        with pytest.raises(Unauthenticated):
            await auth.session(f"tys_{session_id * 2}_{'x' * 43}")
    looked_up = bucket.gets
    for _ in range(5):  # the same unknown id again: remembered, no look-up
        with pytest.raises(Unauthenticated):
            await auth.authenticate(f"Bearer ty_{ids[0]}_{'x' * 43}")

    limit = auth.tokens.lookups.burst + auth.sessions.lookups.burst + 10  # type: ignore[union-attr]
    assert looked_up <= limit and bucket.gets == looked_up
    # a real token still verifies (the watch's copy, or a look-up once allowed)
    assert (await callers.authenticator.authenticate(f"Bearer {callers.tokens['admin']}")).role.value == "admin"


async def test_the_gateways_own_nats_user_starts_reads_and_ends_sessions_on_the_locked_bus(tmp_path: Any) -> None:
    async with locked_bus(tmp_path) as (connect, _):
        gateway = await connect("gateway")
        tokens = await TokenStore.open(gateway.js)
        auth = Authenticator(tokens)
        assert auth.sessions is not None
        _, token = await tokens.create("alice", "researcher", "acme", created_by="test")
        who = await auth.authenticate(f"Bearer {token}")

        _, cookie = await auth.sessions.start(who, token)
        assert await auth.session(cookie) == who
        assert await auth.sessions.end(cookie)
        with pytest.raises(Unauthenticated, match="ended"):
            await auth.session(cookie)


async def test_a_session_started_with_a_jwt_ends_when_the_jwt_does(
    bus: Bus, store: Store, callers: Callers, tmp_path: Any
) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    (tmp_path / "jwks.json").write_text(json.dumps({"keys": [{**public, "kid": "k1", "alg": "RS256"}]}))
    config = jwt_config(
        Settings(
            auth_jwt_issuer="https://idp", auth_jwt_audience="trainyard", auth_jwks_file=str(tmp_path / "jwks.json")
        )
    )
    assert config is not None
    auth = Authenticator(callers.store, JwtVerifier(config))
    expires = time.time() + 600
    claims = {"iss": "https://idp", "aud": "trainyard", "sub": "alice", "exp": expires}
    token = jwt.encode(claims | {"trainyard_role": "operator"}, key, algorithm="RS256", headers={"kid": "k1"})
    async with client(gateway_app(bus, store, auth, Settings(ledger_url=f"sqlite:///{tmp_path}/l.db"))) as browser:
        assert (await log_in(browser, token)).status_code == 303
        assert (await browser.get("/cluster")).status_code == 200
        assert auth.sessions is not None
        auth.sessions.clock = lambda: expires + 1  # within its 12 hours, past the JWT's expiry

        assert (await browser.get("/cluster")).status_code == 303


async def test_sweeping_purges_sessions_that_ended_a_day_ago_and_keeps_the_rest(callers: Callers) -> None:
    auth = callers.authenticator
    assert auth.sessions is not None
    who = await auth.authenticate(f"Bearer {callers.tokens['admin']}")
    now = time.time()
    started = []
    for offset in (-2 * 86_400.0, -3_600.0, 0.0):  # logged in two days ago, an hour ago, now
        auth.sessions.clock = lambda offset=offset: now + offset
        started.append(await auth.sessions.start(who, callers.tokens["admin"]))
    auth.sessions.clock = lambda: now - 1_800.0
    assert await auth.sessions.end(started[1][1])  # logged out half an hour ago
    auth.sessions.clock = lambda: now

    assert await auth.sessions.sweep() == 1  # the one whose 12 hours ended 36 hours ago
    assert await auth.sessions.sweep(keep_s=600.0) == 1  # and, keeping ten minutes, the logout

    assert await auth.session(started[2][1]) == who
    for _, cookie in started[:2]:
        with pytest.raises(Unauthenticated, match="unknown console session"):
            await auth.session(cookie)
