"""Logging in and out of the console, and the guards of its forms.

A person pastes an API token (or a JWT) on ``/login``, whose form carries a
CSRF token tied to a random login cookie.  The credential is verified with
the gateway's :class:`~trainyard.auth.Authenticator` and a server-side session
is started (:mod:`trainyard.auth.sessions`): the HttpOnly, SameSite=Strict
cookie holds the session's id and secret, never the token, and the
Authentication middleware accepts it on console pages only
(:func:`trainyard_gateway.security.session_cookie`).  Logging out ends the
session on the server; so do its 12 hours running out and its token's
revocation.  Every form that changes state carries a CSRF token derived from
the session cookie (an HMAC, so any gateway can check it and no other site can
compute it), and a request the browser marks as cross-site is refused.
"""

from __future__ import annotations

import hmac
import re
import secrets
from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from trainyard.auth import Action, Authenticator, PermissionDenied, Principal, Unauthenticated, authorize
from trainyard_gateway.console.render import page
from trainyard_gateway.errors import UNAVAILABLE
from trainyard_gateway.security import LOGIN_COOKIE, SESSION_COOKIE, csrf_token, login_csrf, read_body

MAX_FORM_BYTES = 256 * 1024


class Forbidden(Exception):
    """A form without a valid CSRF token, or sent from another site."""


def same_site(request: Request) -> bool:
    return request.headers.get("sec-fetch-site", "same-origin") in ("same-origin", "none")


async def read_form(request: Request, *, check_csrf: bool = True) -> dict[str, str]:
    """An url-encoded form's fields (first value of each); :class:`Forbidden`
    when it comes from another site or lacks this session's CSRF token."""
    if not same_site(request):
        raise Forbidden("this form was sent from another site")
    raw = await read_body(request, MAX_FORM_BYTES, "a form")
    fields = {k: v[0] for k, v in parse_qs(raw.decode("utf-8", "replace"), keep_blank_values=True).items()}
    if check_csrf:
        sent = fields.get("csrf") or request.headers.get("x-csrf-token", "")
        expected = csrf_token(request)
        if not expected or not hmac.compare_digest(sent, expected):
            raise Forbidden("the form's CSRF token is missing or stale; reload the page and try again")
    return fields


def principal(request: Request) -> Principal:
    who = getattr(request.state, "principal", None)
    if not isinstance(who, Principal):
        raise Unauthenticated("no session")
    return who


def refusal(request: Request, who: Principal, action: Action) -> Response | None:
    """The 403 page when ``who``'s role may not do ``action``; None when it may."""
    try:
        authorize(who, action)
    except PermissionDenied as err:
        return page(request, "error.html", who, status_code=403, message=str(err))
    return None


async def form_for(request: Request, action: Action) -> tuple[Principal, dict[str, str], Response | None]:
    """The caller and the fields of a form it sent to do ``action``; with the
    403 page instead when its role may not, or the form is not this session's."""
    who = principal(request)
    refused = refusal(request, who, action)
    if refused:
        return who, {}, refused
    try:
        return who, await read_form(request), None
    except Forbidden as err:
        return who, {}, page(request, "error.html", who, status_code=403, message=str(err))


def _login_page(request: Request, nonce: str, status_code: int = 200, message: str = "") -> Response:
    """The login page, whose form carries the CSRF token of the login cookie ``nonce``."""
    response = page(request, "login.html", None, status_code=status_code, message=message, csrf=login_csrf(nonce))
    response.set_cookie(
        LOGIN_COOKIE, nonce, max_age=3600, path="/login", httponly=True, samesite="strict", secure=_https(request)
    )
    return response


def _https(request: Request) -> bool:
    return request.url.scheme == "https"


def _login_nonce(request: Request) -> str:
    nonce = request.cookies.get(LOGIN_COOKIE, "")
    return nonce if _NONCE.fullmatch(nonce) else secrets.token_urlsafe(24)


_NONCE = re.compile(r"[A-Za-z0-9_-]{32}")


def build_router(auth: Authenticator) -> APIRouter:
    router = APIRouter(include_in_schema=False)

    @router.get("/login")
    async def login_page(request: Request, expired: int = 0) -> Response:
        message = "Your session has ended (logged out, expired, or its token revoked); log in again." if expired else ""
        return _login_page(request, _login_nonce(request), message=message)

    @router.post("/login")
    async def login(request: Request) -> Response:
        nonce = _login_nonce(request)
        try:
            fields = await read_form(request, check_csrf=False)
        except Forbidden as err:
            return _login_page(request, nonce, status_code=403, message=str(err))
        sent, expected = fields.get("csrf", ""), login_csrf(request.cookies.get(LOGIN_COOKIE, ""))
        if not expected or not hmac.compare_digest(sent, expected):
            message = "the login form's CSRF token is missing or stale; log in from this page"
            return _login_page(request, nonce, status_code=403, message=message)
        token = fields.get("token", "").strip()
        try:
            who = await auth.authenticate(f"Bearer {token}")
            if auth.sessions is None:
                raise Unauthenticated("this gateway keeps no console sessions")
            _, cookie = await auth.sessions.start(who, token)
        except Unauthenticated as err:
            return _login_page(request, nonce, status_code=401, message=f"That token does not verify: {err}")
        except UNAVAILABLE as err:
            return _login_page(request, nonce, status_code=503, message=f"Cannot check the token now: {err!r}")
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(
            SESSION_COOKIE,
            cookie,
            max_age=int(auth.sessions.lifetime_s),
            path="/",
            httponly=True,
            samesite="strict",
            secure=_https(request),
        )
        response.delete_cookie(LOGIN_COOKIE, path="/login")
        return response

    @router.post("/logout")
    async def logout(request: Request) -> Response:
        try:
            await read_form(request)
        except Forbidden as err:
            return page(request, "error.html", principal(request), status_code=403, message=str(err))
        if auth.sessions is not None:
            await auth.sessions.end(request.cookies.get(SESSION_COOKIE, ""))  # ended for every gateway
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(SESSION_COOKIE, path="/")
        return response

    return router
