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

from typing import Any

from fastapi import Depends, Request
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from trainyard.api.errors import UNAVAILABLE, PayloadTooLarge, unauthenticated_response, unavailable_response
from trainyard.auth import Action, Authenticator, Principal, Unauthenticated, authorize

#: Pages anyone may read: liveness and the API's own description.
PUBLIC_PATHS = frozenset({"/healthz", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})
SCHEME = "bearer"


class Authentication:
    def __init__(self, app: ASGIApp, auth: Authenticator) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        authorization = Headers(scope=scope).get("authorization")
        try:
            who = await self.auth.authenticate(authorization)
        except Unauthenticated as err:
            await unauthenticated_response(str(err), bool(authorization))(scope, receive, send)
            return
        except UNAVAILABLE as err:
            await unavailable_response(err)(scope, receive, send)
            return
        scope.setdefault("state", {})["principal"] = who
        await self.app(scope, receive, send)


def principal_of(request: Request) -> Principal:
    who = getattr(request.state, "principal", None)
    if not isinstance(who, Principal):  # a route mounted without the middleware: refuse, never guess
        raise Unauthenticated("no credentials: send the header 'Authorization: Bearer <API token or JWT>'")
    return who


def allow(action: Action) -> Any:
    """A route dependency: the verified principal, if its role may do ``action`` (else 403)."""

    def dependency(request: Request) -> Principal:
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


def declare_security(schema: dict[str, Any]) -> None:
    """Declare the bearer scheme in an OpenAPI document: required everywhere
    but on the public pages, with the 401 and 403 answers."""
    components = schema.setdefault("components", {})
    components.setdefault("securitySchemes", {})[SCHEME] = {
        "type": "http",
        "scheme": "bearer",
        "description": "A Trainyard API token (ty_...) or a JWT from the configured issuer; see docs/security.md.",
    }
    schema["security"] = [{SCHEME: []}]
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    for path, operations in schema.get("paths", {}).items():
        for operation in operations.values():
            if path in PUBLIC_PATHS:
                operation["security"] = []
                continue
            responses = operation.setdefault("responses", {})
            responses.setdefault("401", {"description": "No credentials, or they do not verify", "content": error})
            responses.setdefault("403", {"description": "The caller's role may not do this", "content": error})
