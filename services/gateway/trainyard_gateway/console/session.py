"""Logging in and out of the console, and the guards of its forms.

A person pastes an API token on ``/login``; it is verified with the gateway's
:class:`~trainyard.auth.Authenticator` and kept in an HttpOnly,
SameSite=Strict cookie that the Authentication middleware accepts on console
pages only (:func:`trainyard_gateway.security.session_authorization`).  Every form
that changes state carries a CSRF token derived from the session token (an
HMAC, so any gateway can check it and no other site can compute it), and a
request the browser marks as cross-site is refused.
"""

from __future__ import annotations

import hmac
from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from trainyard.auth import Action, Authenticator, PermissionDenied, Principal, Unauthenticated, authorize
from trainyard_gateway.console.render import page
from trainyard_gateway.errors import UNAVAILABLE
from trainyard_gateway.security import SESSION_COOKIE, csrf_token, read_body

MAX_FORM_BYTES = 256 * 1024
SESSION_MAX_AGE_S = 12 * 3600


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


def build_router(auth: Authenticator) -> APIRouter:
    router = APIRouter(include_in_schema=False)

    @router.get("/login")
    async def login_page(request: Request, expired: int = 0) -> Response:
        message = "Your session has ended (the token was revoked or expired); log in again." if expired else ""
        return page(request, "login.html", None, message=message)

    @router.post("/login")
    async def login(request: Request) -> Response:
        try:
            fields = await read_form(request, check_csrf=False)
        except Forbidden as err:
            return page(request, "login.html", None, status_code=403, message=str(err))
        token = fields.get("token", "").strip()
        try:
            await auth.authenticate(f"Bearer {token}")
        except Unauthenticated as err:
            return page(request, "login.html", None, status_code=401, message=f"That token does not verify: {err}")
        except UNAVAILABLE as err:
            return page(request, "login.html", None, status_code=503, message=f"Cannot check the token now: {err!r}")
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(
            SESSION_COOKIE,
            token,
            max_age=SESSION_MAX_AGE_S,
            path="/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    @router.post("/logout")
    async def logout(request: Request) -> Response:
        try:
            await read_form(request)
        except Forbidden as err:
            return page(request, "error.html", principal(request), status_code=403, message=str(err))
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(SESSION_COOKIE, path="/")
        return response

    return router
