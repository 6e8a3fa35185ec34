"""The one error body every REST answer uses, and the one place that maps
exceptions to HTTP statuses."""

from __future__ import annotations

from typing import Any

import msgspec
import nats.errors
import redis.exceptions
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException

from trainyard.auth import KeysUnavailable, PermissionDenied, Unauthenticated, challenge
from trainyard.domain.job import ValidationError
from trainyard.store.caught_up import ProjectionRebuilding
from trainyard_gateway.jobs import BadCursor, Conflict, InvalidRequest, NotFound
from trainyard_gateway.schema import ErrorBody, FieldError

#: Infrastructure failures: the caller should retry.
UNAVAILABLE = (
    nats.errors.Error,
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    KeysUnavailable,
    ProjectionRebuilding,
)


class PayloadTooLarge(Exception):
    pass


_encoder = msgspec.json.Encoder()


def json_response(value: Any, status_code: int = 200) -> Response:
    return Response(content=_encoder.encode(value), status_code=status_code, media_type="application/json")


def error_response(status_code: int, code: str, message: str, errors: list[ValidationError] = ()) -> Response:
    fields = [FieldError(e.field, e.message) for e in errors]
    return json_response(ErrorBody(code=code, message=message, errors=fields), status_code)


def unauthenticated_response(message: str, credentials_sent: bool) -> Response:
    """401 with the ``WWW-Authenticate`` challenge."""
    response = error_response(401, "unauthenticated", message)
    response.headers["WWW-Authenticate"] = challenge(message if credentials_sent else None)
    return response


def unavailable_response(err: Exception) -> Response:
    if isinstance(err, ProjectionRebuilding):
        # a caught-up answer or none: never a 404 or an older state while the projection is rebuilt
        response = error_response(503, "rebuilding", str(err))
        response.headers["Retry-After"] = str(err.retry_after_s)
        return response
    return error_response(
        503, "unavailable", f"NATS, Redis or the identity provider is unavailable, try again: {err!r}"
    )


def install_error_handlers(app: FastAPI) -> None:
    async def invalid(_: Request, err: Exception) -> Response:
        assert isinstance(err, InvalidRequest)
        if isinstance(err, BadCursor):
            return error_response(400, "invalid_cursor", f"the cursor is not usable here: {err}", err.errors)
        return error_response(422, "invalid_argument", "the request is invalid; nothing was changed", err.errors)

    async def unauthenticated(request: Request, err: Exception) -> Response:
        return unauthenticated_response(str(err), bool(request.headers.get("authorization")))

    async def forbidden(_: Request, err: Exception) -> Response:
        return error_response(403, "permission_denied", str(err))

    async def not_found(_: Request, err: Exception) -> Response:
        return error_response(
            404, "not_found", f"no job {str(err)!r}; a new job appears here once admission has accepted or rejected it"
        )

    async def conflict(_: Request, err: Exception) -> Response:
        return error_response(409, "conflict", str(err))

    async def too_large(_: Request, err: Exception) -> Response:
        return error_response(413, "payload_too_large", str(err))

    async def unavailable(_: Request, err: Exception) -> Response:
        return unavailable_response(err)

    async def request_invalid(_: Request, err: Exception) -> Response:
        assert isinstance(err, RequestValidationError)
        errors = [
            ValidationError(".".join(str(p) for p in e["loc"][1:]) or str(e["loc"][0]), e["msg"]) for e in err.errors()
        ]
        return error_response(422, "invalid_argument", "the request is invalid; nothing was changed", errors)

    async def http_error(_: Request, err: Exception) -> Response:
        assert isinstance(err, HTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(err.status_code, "http_error")
        return error_response(err.status_code, code, str(err.detail))

    app.add_exception_handler(InvalidRequest, invalid)
    app.add_exception_handler(Unauthenticated, unauthenticated)
    app.add_exception_handler(PermissionDenied, forbidden)
    app.add_exception_handler(NotFound, not_found)
    app.add_exception_handler(Conflict, conflict)
    app.add_exception_handler(PayloadTooLarge, too_large)
    app.add_exception_handler(RequestValidationError, request_invalid)
    app.add_exception_handler(HTTPException, http_error)
    for infrastructure in UNAVAILABLE:
        app.add_exception_handler(infrastructure, unavailable)
