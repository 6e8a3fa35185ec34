"""The REST front door: FastAPI over :class:`~trainyard.api.jobs.JobOperations`
and the Redis projections.

Bodies are decoded and responses encoded with msgspec, so a bad submission
gets one ``{field, message}`` per problem, named the way the spec names it
(``roles[0].gpus_per_replica``), and changes nothing.

Tenancy: a request that carries ``X-Trainyard-Tenant`` acts as that tenant.
It sees and cancels only that tenant's jobs (another tenant's job is 404, as
if it did not exist) and may not submit or read usage for another tenant
(403).  The header is trusted: it must be set by an authenticating proxy in
front of the gateway.
"""

from __future__ import annotations


import asyncio
import inspect
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated, Any

import msgspec
import nats.errors
import redis.exceptions
from fastapi import APIRouter, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from trainyard.api.jobs import Conflict, InvalidRequest, JobOperations, NotFound
from trainyard.api.metrics import CONTENT_TYPE, JOB_STATUSES, GatewayMetrics
from trainyard.domain.job import JobSpec, TopologyLevel, ValidationError
from trainyard.store import Store, views
from trainyard.store.views import JobView, NodeRecord

#: Returns usage rows (plain dicts) for one tenant, or for all when ``None``.
UsageSource = Callable[[str | None], list[dict[str, Any]] | Awaitable[list[dict[str, Any]]]]

TENANT_HEADER = "X-Trainyard-Tenant"
MAX_BODY_BYTES = 1024 * 1024
MAX_LIST_LIMIT = 1000
MAX_REASON_CHARS = 256


# --- wire shapes -------------------------------------------------------------


class SubmitJobBody(JobSpec, frozen=True):
    """A job spec plus an optional ``job_id`` (the idempotency key)."""

    job_id: str | None = None

    def job_spec(self) -> JobSpec:
        return JobSpec(**{name: getattr(self, name) for name in JobSpec.__struct_fields__})


class Submitted(msgspec.Struct):
    job_id: str
    status: str  # "submitted": admission will accept or reject it


class Cancelling(msgspec.Struct):
    job_id: str
    status: str  # "cancelling": the cancel command is published


class JobList(msgspec.Struct):
    jobs: list[JobView]


class NodeList(msgspec.Struct):
    nodes: list[NodeRecord]


class Health(msgspec.Struct):
    status: str  # "ok" or "unavailable"
    checks: dict[str, str]


class FieldError(msgspec.Struct):
    field: str
    message: str


class ErrorBody(msgspec.Struct, omit_defaults=True):
    """Every error the gateway returns."""

    code: str  # invalid_argument, permission_denied, not_found, conflict, ...
    message: str
    errors: list[FieldError] = []  # one per bad field, for invalid_argument


class Forbidden(Exception):
    """A tenant-scoped caller asked to act for another tenant."""


# --- decoding ------------------------------------------------------------------

_encoder = msgspec.json.Encoder()
_submission = msgspec.json.Decoder(SubmitJobBody)
_AT = re.compile(r"^(?P<message>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)
_MISSING = re.compile(r"^Object missing required field `(?P<name>[^`]+)`$")


def decode_errors(err: msgspec.MsgspecError, root: str = "body") -> list[ValidationError]:
    """Turn a msgspec decode/convert error into a field error named like
    ``validate_job_spec`` names fields (``roles[0].replicas``)."""
    if not isinstance(err, msgspec.ValidationError):  # ValidationError subclasses DecodeError
        return [ValidationError(root, f"the body is not valid JSON: {err}")]
    match = _AT.match(str(err))
    message = match["message"] if match else str(err)
    path = (match["path"] or "").lstrip(".") if match else ""
    missing = _MISSING.match(message)
    if missing:
        path = f"{path}.{missing['name']}" if path else missing["name"]
        message = "is required"
    if message.startswith("Invalid enum value") and path.endswith("level"):
        message += "; use one of " + ", ".join(level.value for level in TopologyLevel)
    return [ValidationError(path or root, message.replace("`", ""))]


def decode_submission(raw: bytes) -> SubmitJobBody:
    try:
        return _submission.decode(raw)
    except msgspec.MsgspecError as err:
        raise InvalidRequest(decode_errors(err)) from err


def check_tenant(scope: str | None, tenant: str | None) -> str | None:
    """The tenant a request acts for; a scoped caller may not name another."""
    if scope is None:
        return tenant
    if tenant is not None and tenant != scope:
        raise Forbidden(f"tenant {scope!r} may not act for tenant {tenant!r}")
    return scope


def json_response(value: Any, status_code: int = 200) -> Response:
    return Response(content=_encoder.encode(value), status_code=status_code, media_type="application/json")


def error_response(status_code: int, code: str, message: str, errors: list[ValidationError] = ()) -> Response:
    fields = [FieldError(e.field, e.message) for e in errors]
    return json_response(ErrorBody(code=code, message=message, errors=fields), status_code)


# --- request counting ----------------------------------------------------------


class RequestCounter:
    """Counts requests by method, route template (never the raw path, so job
    ids do not explode the label set) and status."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def sending(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            self.metrics.http_requests.labels(scope["method"], route, str(status)).inc()


# --- the application -------------------------------------------------------------

TenantScope = Annotated[
    str | None,
    Header(alias=TENANT_HEADER, description="Act as this tenant only (set by the authenticating proxy)."),
]


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _doc(status: int, description: str, schema: str) -> dict[int, dict[str, Any]]:
    return {status: {"description": description, "content": {"application/json": {"schema": _ref(schema)}}}}


_INVALID = _doc(422, "Bad input: one entry per bad field; nothing changed", "ErrorBody")
_FORBIDDEN = _doc(403, "The tenant header names another tenant", "ErrorBody")
_NOT_FOUND = _doc(404, "No such job (or not visible to this tenant)", "ErrorBody")
_SCHEMAS = (SubmitJobBody, Submitted, Cancelling, JobView, JobList, NodeList, Health, ErrorBody)


def create_app(
    ops: JobOperations,
    store: Store,
    usage_source: UsageSource | None = None,
    metrics: GatewayMetrics | None = None,
    routers: Sequence[APIRouter] = (),
) -> FastAPI:
    metrics = metrics or GatewayMetrics()
    app = FastAPI(
        title="Trainyard",
        version="1",
        description="Submit, watch and cancel training jobs; read the fleet. "
        f"Send `{TENANT_HEADER}` to act as one tenant.",
    )
    app.add_middleware(RequestCounter, metrics=metrics)
    _install_error_handlers(app)
    _install_schemas(app)

    @app.post(
        "/v1/jobs",
        status_code=202,
        summary="Submit a job",
        responses={**_doc(202, "Published; admission accepts or rejects it", "Submitted"), **_INVALID, **_FORBIDDEN},
        openapi_extra={
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("SubmitJobBody")}}}
        },
    )
    async def submit_job(request: Request, scope: TenantScope = None) -> Response:
        raw = await request.body()
        if len(raw) > MAX_BODY_BYTES:
            return error_response(413, "payload_too_large", f"a job spec is at most {MAX_BODY_BYTES} bytes")
        body = decode_submission(raw)
        spec = body.job_spec()
        check_tenant(scope, spec.tenant)
        try:
            job_id = await ops.submit(spec, body.job_id)
        except ValueError as err:  # a name that validates but cannot be a subject token
            raise InvalidRequest([ValidationError("tenant", str(err))]) from err
        return json_response(Submitted(job_id=job_id, status="submitted"), 202)

    @app.get("/v1/jobs/{job_id}", summary="Read a job", responses={**_doc(200, "The job", "JobView"), **_NOT_FOUND})
    async def get_job(job_id: str, scope: TenantScope = None) -> Response:
        return json_response(await ops.get(job_id, scope))

    @app.get(
        "/v1/jobs",
        summary="List jobs, newest first",
        responses={**_doc(200, "The jobs", "JobList"), **_INVALID, **_FORBIDDEN},
    )
    async def list_jobs(
        scope: TenantScope = None,
        tenant: str | None = None,
        status: str | None = Query(None, description="One of: " + ", ".join(JOB_STATUSES)),
        limit: int = Query(100, ge=1, le=MAX_LIST_LIMIT),
    ) -> Response:
        if status is not None and status not in JOB_STATUSES:
            raise InvalidRequest([ValidationError("status", f"{status!r} is not one of {', '.join(JOB_STATUSES)}")])
        tenant = check_tenant(scope, tenant)
        return json_response(JobList(await ops.list(tenant=tenant, status=status, limit=limit)))

    @app.delete(
        "/v1/jobs/{job_id}",
        status_code=202,
        summary="Cancel a job",
        responses={
            **_doc(202, "The cancel command is published", "Cancelling"),
            **_NOT_FOUND,
            **_doc(409, "The job has already finished", "ErrorBody"),
            **_INVALID,
        },
    )
    async def cancel_job(job_id: str, scope: TenantScope = None, reason: str | None = None) -> Response:
        if reason is not None and not 0 < len(reason) <= MAX_REASON_CHARS:
            raise InvalidRequest([ValidationError("reason", f"give 1-{MAX_REASON_CHARS} characters")])
        job = await ops.cancel(job_id, scope, reason or "cancelled by user")
        return json_response(Cancelling(job_id=job.job_id, status="cancelling"), 202)

    @app.get("/v1/nodes", summary="List nodes with state and free GPUs", responses=_doc(200, "The nodes", "NodeList"))
    async def list_nodes() -> Response:
        return json_response(NodeList(await views.list_nodes(store)))

    @app.get(
        "/v1/usage",
        summary="GPU usage rows from accounting",
        description="Tenants (X-Trainyard-Tenant) read only their own usage; finance (X-Trainyard-Role: finance) "
        "reads every tenant's. `from`/`to` take a date (`to` includes that day), an ISO 8601 time or Unix seconds; "
        "`group_by` is a comma-separated list of tenant, queue, gpu_type, job.",
        responses={**_FORBIDDEN, **_INVALID, **_doc(501, "No usage source is connected", "ErrorBody")},
    )
    async def usage(
        scope: TenantScope = None,
        tenant: str | None = None,
        role: str | None = Header(None, alias="X-Trainyard-Role", description="`finance` reads every tenant."),
        start: str | None = Query(None, alias="from", description="Start of the window (inclusive)."),
        end: str | None = Query(None, alias="to", description="End of the window (a date includes that day)."),
        group_by: str | None = Query(None, description="Comma-separated: tenant, queue, gpu_type, job."),
    ) -> Response:
        from trainyard.api.finance_api import FINANCE_ROLE, usage_query

        if usage_source is None:
            return error_response(
                501, "not_implemented", "usage is not available: this gateway has no usage source (accounting)"
            )
        tenant = tenant if role == FINANCE_ROLE else check_tenant(scope, tenant)
        rows = usage_source(tenant, **usage_query(start, end, group_by))
        if inspect.isawaitable(rows):
            rows = await rows
        return json_response(rows)

    @app.get(
        "/healthz",
        summary="Redis and NATS reachable",
        responses={**_doc(200, "Healthy", "Health"), **_doc(503, "Unhealthy", "Health")},
    )
    async def healthz() -> Response:
        checks = {"redis": "ok", "nats": "ok" if ops.bus.nc.is_connected else "not connected"}
        try:
            await asyncio.wait_for(store.redis.ping(), timeout=2.0)
        except (redis.exceptions.RedisError, OSError, TimeoutError) as err:
            checks["redis"] = f"unreachable: {err!r}"
        healthy = all(v == "ok" for v in checks.values())
        return json_response(Health("ok" if healthy else "unavailable", checks), 200 if healthy else 503)

    @app.get("/metrics", summary="Prometheus metrics", response_class=Response)
    async def prometheus() -> Response:
        return Response(content=await metrics.render(store), media_type=CONTENT_TYPE)

    for router in routers:  # node operations, finance exports
        app.include_router(router)
    return app


def _install_error_handlers(app: FastAPI) -> None:
    async def invalid(_: Request, err: Exception) -> Response:
        assert isinstance(err, InvalidRequest)
        return error_response(422, "invalid_argument", "the request is invalid; nothing was changed", err.errors)

    async def forbidden(_: Request, err: Exception) -> Response:
        return error_response(403, "permission_denied", str(err))

    async def not_found(_: Request, err: Exception) -> Response:
        return error_response(
            404, "not_found", f"no job {str(err)!r}; a new job appears here once admission has accepted or rejected it"
        )

    async def conflict(_: Request, err: Exception) -> Response:
        return error_response(409, "conflict", str(err))

    async def unavailable(_: Request, err: Exception) -> Response:
        return error_response(503, "unavailable", f"NATS or Redis is unavailable, try again: {err!r}")

    async def request_invalid(_: Request, err: Exception) -> Response:
        assert isinstance(err, RequestValidationError)
        errors = [
            ValidationError(".".join(str(p) for p in e["loc"][1:]) or str(e["loc"][0]), e["msg"])
            for e in err.errors()
        ]
        return error_response(422, "invalid_argument", "the request is invalid; nothing was changed", errors)

    async def http_error(_: Request, err: Exception) -> Response:
        assert isinstance(err, HTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(err.status_code, "http_error")
        return error_response(err.status_code, code, str(err.detail))

    app.add_exception_handler(InvalidRequest, invalid)
    app.add_exception_handler(Forbidden, forbidden)
    app.add_exception_handler(NotFound, not_found)
    app.add_exception_handler(Conflict, conflict)
    app.add_exception_handler(RequestValidationError, request_invalid)
    app.add_exception_handler(HTTPException, http_error)
    for infrastructure in (nats.errors.Error, redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
        app.add_exception_handler(infrastructure, unavailable)


def _install_schemas(app: FastAPI) -> None:
    """Add the msgspec shapes to the OpenAPI components the routes refer to."""
    _, components = msgspec.json.schema_components(_SCHEMAS, ref_template="#/components/schemas/{name}")
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = generate()
            schema.setdefault("components", {}).setdefault("schemas", {}).update(components)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
