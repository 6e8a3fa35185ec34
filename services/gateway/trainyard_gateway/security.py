"""Authentication and authorization of REST requests.

:class:`Authentication` (ASGI middleware) verifies the bearer credential of
every request except the public pages (:data:`PUBLIC_PATHS`) before any route
runs, answering 401 with a ``WWW-Authenticate`` challenge when it is missing
or does not verify, and leaves the :class:`~trainyard.auth.Principal` in the
request state.  Each route then names its action with :func:`allow`, which
answers 403 when the principal's role may not do it.  Client-sent headers
never grant anything: identity comes only from the verified credential.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from typing import Any

from fastapi import Depends, Request, Security
from fastapi.security import HTTPBearer
from starlette.datastructures import Headers
from starlette.requests import HTTPConnection
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trainyard.auth import Action, Authenticator, Principal, Unauthenticated, authorize
from trainyard_gateway.errors import UNAVAILABLE, PayloadTooLarge, unauthenticated_response, unavailable_response

#: Pages anyone may read: liveness, the API's own description and the console's login page.
PUBLIC_PATHS = frozenset({"/healthz", "/docs", "/docs/oauth2-redirect", "/openapi.json", "/login"})
#: Path prefixes anyone may read: the console's and the API docs' vendored assets.
PUBLIC_PREFIXES = ("/static/",)

#: The web console keeps its session (``tys_<id>_<secret>``, see
#: :mod:`trainyard.auth.sessions`; never the API token) in this cookie
#: (HttpOnly, SameSite=Strict); it is accepted on console pages only, never on the API.
SESSION_COOKIE = "trainyard_session"
#: A random nonce the login page sets (HttpOnly, SameSite=Strict, 1 hour);
#: the login form must carry :func:`login_csrf` of it.
LOGIN_COOKIE = "trainyard_login"
#: The console's pages (trainyard_gateway.console) besides its home, "/".
CONSOLE_PREFIXES = ("/jobs", "/cluster", "/nodes", "/usage", "/finance", "/admin", "/logout")


def is_public(path: str) -> bool:
    return path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES)


def is_console_page(path: str) -> bool:
    return path == "/" or any(path == p or path.startswith(p + "/") for p in CONSOLE_PREFIXES)


def csrf_token(request: Request) -> str:
    """The CSRF token of the console's forms: an HMAC of the session token, so
    any gateway can check it and no other site can compute it ("" without a session)."""
    token = request.cookies.get(SESSION_COOKIE, "")
    return hmac.new(token.encode(), b"trainyard-console-csrf", hashlib.sha256).hexdigest()[:40] if token else ""


def login_csrf(nonce: str) -> str:
    """The login form's CSRF token: an HMAC of the login cookie's random nonce,
    so another site can neither read nor compute it (login CSRF would log the
    victim in as the attacker)."""
    return hmac.new(nonce.encode(), b"trainyard-console-login", hashlib.sha256).hexdigest()[:40] if nonce else ""


def session_cookie(scope: Scope) -> str | None:
    """The console's session cookie, for a console page asked for by the
    console itself: never on an API path, never when the browser says the
    request comes from another site (``Sec-Fetch-Site``; the cookie is
    SameSite=Strict as well)."""
    if not is_console_page(scope["path"]):
        return None
    if Headers(scope=scope).get("sec-fetch-site", "same-origin") == "cross-site":
        return None
    return HTTPConnection(scope).cookies.get(SESSION_COOKIE) or None


class Authentication:
    def __init__(self, app: ASGIApp, auth: Authenticator) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or is_public(scope["path"]):
            await self.app(scope, receive, send)
            return
        sent = Headers(scope=scope).get("authorization")
        cookie = session_cookie(scope) if sent is None else None
        verify = (
            functools.partial(self.auth.authenticate, sent)
            if cookie is None
            else functools.partial(self.auth.session, cookie)
        )
        try:
            who = await verify()
        except Unauthenticated as err:
            if sent is None and is_console_page(scope["path"]):  # a person without a session: log in
                await to_login(scope, expired=cookie is not None)(scope, receive, send)
                return
            await unauthenticated_response(str(err), bool(sent))(scope, receive, send)
            return
        except UNAVAILABLE as err:
            await unavailable_response(err)(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        state["principal"] = who
        state["reverify"] = verify
        await self.app(scope, receive, send)


#: Sent with every response, API and console alike: no page of the gateway
#: may be framed by another (clickjacking), no body sniffed as another type,
#: and no path or query (job ids, tenants) leaked to another site as a referrer.
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"x-frame-options", b"DENY"),
    (b"content-security-policy", b"frame-ancestors 'none'; base-uri 'self'; form-action 'self'; object-src 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
)


class SecurityHeaders:
    """ASGI middleware adding :data:`SECURITY_HEADERS` to every HTTP response
    (a header the route set itself is kept)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                headers.extend((name, value) for name, value in SECURITY_HEADERS if name not in present)
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, sending)


def to_login(scope: Scope, expired: bool) -> Response:
    """A console page without a session that verifies: back to the login page
    (htmx follows ``HX-Redirect``; a live-update stream just ends with 401)."""
    headers = Headers(scope=scope)
    target = "/login" + ("?expired=1" if expired else "")
    response: Response
    if "text/event-stream" in headers.get("accept", ""):
        response = PlainTextResponse("log in again", status_code=401)
    elif headers.get("hx-request"):
        response = PlainTextResponse("log in again", status_code=401, headers={"HX-Redirect": target})
    else:
        response = RedirectResponse(target, status_code=303)
    if expired:
        response.delete_cookie(SESSION_COOKIE, path="/")
    return response


async def still_verified(request: Request) -> bool:
    """Whether the credential this request came with verifies still: a response
    that goes on for minutes (a console's live stream) asks before each part, so
    a token revoked or expired meanwhile ends it.  The token store away for a
    moment is not a refusal."""
    reverify = getattr(request.state, "reverify", None)
    if reverify is None:
        return False
    try:
        await reverify()
    except Unauthenticated:
        return False
    except UNAVAILABLE:
        return True
    return True


def principal_of(request: Request) -> Principal:
    who = getattr(request.state, "principal", None)
    if not isinstance(who, Principal):  # a route mounted without the middleware: refuse, never guess
        raise Unauthenticated("no credentials: send the header 'Authorization: Bearer <API token or JWT>'")
    return who


#: The bearer scheme as FastAPI declares it in the OpenAPI document, on every
#: route that uses :func:`allow`.  It refuses nothing itself (``auto_error``
#: off): the :class:`Authentication` middleware has verified the caller.
BEARER = HTTPBearer(
    scheme_name="bearer",
    description="A Trainyard API token (ty_...) or a JWT from the configured issuer; see docs/security.md.",
    auto_error=False,
)


def allow(action: Action) -> Any:
    """A route dependency: the verified principal, if its role may do ``action`` (else 403)."""

    async def dependency(request: Request, _: Any = Security(BEARER)) -> Principal:  # async: no thread hop
        who = principal_of(request)
        authorize(who, action)
        return who

    dependency.__name__ = f"allow_{action.value.replace('.', '_')}"
    return Depends(dependency)


async def read_body(request: Request, limit: int, what: str = "a request body") -> bytes:
    """The body, refused with :class:`PayloadTooLarge` (413) past ``limit``
    bytes without reading more than that."""
    too_large = PayloadTooLarge(f"{what} is at most {limit} bytes ({limit // 1024} KiB); send a smaller one")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)
