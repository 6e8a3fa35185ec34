"""The REST front door: FastAPI over :class:`~trainyard_gateway.jobs.JobOperations`
and the Redis projections.

Bodies are decoded and responses encoded with msgspec, so a bad submission
gets one ``{field, message}`` per problem, named the way the spec names it
(``roles[0].gpus_per_replica``), and changes nothing.

Identity: every route but ``/healthz`` and the API's description needs
``Authorization: Bearer <API token or JWT>`` (401 without; see
:mod:`trainyard_gateway.security`), and each route's action is checked against
the role's permissions (403; :mod:`trainyard.auth.policy`).  A researcher or
tenant-admin acts only inside its tenant: another tenant's job is 404, as if
it did not exist, and naming another tenant is 403.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import redis.exceptions
from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import Response
from starlette.routing import Match, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from trainyard.auth import Action, Authenticator, Principal, authorize, tenant_filter
from trainyard.domain.job import ValidationError
from trainyard.store import Store, views
from trainyard_gateway import finance_api, openapi, pages, tokens_api
from trainyard_gateway.console import assets
from trainyard_gateway.decoding import decode_submission
from trainyard_gateway.errors import error_response, install_error_handlers, json_response
from trainyard_gateway.jobs import (
    MAX_LIST_LIMIT,
    MAX_REASON_CHARS,
    MAX_SUBMIT_BYTES,
    JobOperations,
    check_job_id,
    check_tenant_name,
    require_valid,
)
from trainyard_gateway.metrics import CONTENT_TYPE, JOB_STATUSES, GatewayMetrics
from trainyard_gateway.openapi import answer
from trainyard_gateway.schema import Cancelling, ErrorBody, Health, JobList, JobView, NodeList, SubmitJobBody, Submitted
from trainyard_gateway.security import Authentication, SecurityHeaders, allow, principal_of, read_body

#: Returns usage rows (plain dicts) for one tenant, or for all when ``None``.
UsageSource = Callable[..., list[dict[str, Any]] | Awaitable[list[dict[str, Any]]]]


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


_INVALID = answer(422, "Bad input: one entry per bad field; nothing changed", ErrorBody)
_FORBIDDEN = answer(403, "The caller's role may not do this, or it names another tenant", ErrorBody)
_NOT_FOUND = answer(404, "No such job (or not visible to this caller)", ErrorBody)
_BAD_CURSOR = answer(400, "The cursor is damaged, or was given for other filters; nothing changed", ErrorBody)


def create_app(
    ops: JobOperations,
    store: Store,
    auth: Authenticator,
    usage_source: UsageSource | None = None,
    metrics: GatewayMetrics | None = None,
    routers: Sequence[APIRouter] = (),
) -> FastAPI:
    """The gateway's app: the job routes, ``routers`` (node operations, finance
    exports, the console, dead letters) and the API tokens, all behind the
    bearer scheme; ``/healthz`` and the API's description are public."""
    metrics = metrics or GatewayMetrics()
    app = FastAPI(
        title="Trainyard",
        version="1",
        description="Submit, watch and cancel training jobs; read the fleet. "
        "Send `Authorization: Bearer <API token or JWT>`; see docs/security.md for the roles.",
        docs_url=None,  # served below from the package's own Swagger UI assets, never a CDN
        redoc_url=None,
    )
    app.add_middleware(Authentication, auth=auth)
    app.add_middleware(SecurityHeaders)  # around Authentication: its 401s and redirects carry them too
    app.add_middleware(RequestCounter, metrics=metrics)  # outermost: counts the 401s too
    install_error_handlers(app)
    openapi.install(app)
    app.mount(assets.STATIC_URL, assets.static_files(), name="static")

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> Response:
        return assets.swagger_page("/openapi.json", f"{app.title} API")

    @app.get("/docs/oauth2-redirect", include_in_schema=False)
    async def swagger_ui_redirect() -> Response:
        return assets.swagger_oauth2_redirect()

    app.include_router(job_router(ops, store, metrics, usage_source), responses=openapi.GUARDED)
    app.router.routes.insert(0, submit_route(ops))  # ahead of FastAPI's POST /v1/jobs, which documents it

    @app.get(
        "/healthz",
        summary="Redis and NATS reachable (no credentials needed)",
        responses={**answer(200, "Healthy", Health), **answer(503, "Unhealthy", Health)},
    )
    async def healthz() -> Response:
        checks = {"redis": "ok", "nats": "ok" if ops.bus.nc.is_connected else "not connected"}
        try:
            await asyncio.wait_for(store.redis.ping(), timeout=2.0)
        except (redis.exceptions.RedisError, OSError, TimeoutError) as err:
            checks["redis"] = f"unreachable: {err!r}"
        healthy = all(v == "ok" for v in checks.values())
        return json_response(Health("ok" if healthy else "unavailable", checks), 200 if healthy else 503)

    for router in (tokens_api.token_router(ops.bus, auth.tokens), *routers):
        app.include_router(router, responses=openapi.GUARDED)
    return app


class _Route(Route):
    """A plain Starlette route that leaves itself in the scope, as FastAPI's do
    (the request counter labels by ``scope["route"].path``)."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child = super().matches(scope)
        if match is not Match.NONE:
            child["route"] = self
        return match, child


async def submit(ops: JobOperations, request: Request) -> Response:
    """``POST /v1/jobs``: the body decoded with msgspec straight into the API
    type; errors raised here reach the same handlers as any route's."""
    who = principal_of(request)
    authorize(who, Action.JOB_SUBMIT)
    body = decode_submission(await read_body(request, MAX_SUBMIT_BYTES, "a job submission"))
    spec = body.job_spec()
    require_valid(check_tenant_name(spec.tenant))
    tenant_filter(who, Action.JOB_SUBMIT, spec.tenant)
    job_id = await ops.submit(spec, body.job_id, actor=who.actor)
    return json_response(Submitted(job_id=job_id, status="submitted"), 202)


def submit_route(ops: JobOperations) -> Route:
    """The hot path, without FastAPI's per-request dependency solving; the
    FastAPI route of the same path stays for the OpenAPI document."""

    async def endpoint(request: Request) -> Response:
        return await submit(ops, request)

    return _Route("/v1/jobs", endpoint, methods=["POST"])


def job_router(
    ops: JobOperations, store: Store, metrics: GatewayMetrics, usage_source: UsageSource | None
) -> APIRouter:
    """Jobs, the node list, usage and the metrics: what a verified caller reads and does."""
    router = APIRouter()

    @router.post(
        "/v1/jobs",
        status_code=202,
        summary="Submit a job",
        responses={
            **answer(202, "Published; admission accepts or rejects it", Submitted),
            **_INVALID,
            **_FORBIDDEN,
            **answer(409, "The job id is another tenant's job's", ErrorBody),
            **answer(413, f"The body is over {MAX_SUBMIT_BYTES // 1024} KiB", ErrorBody),
        },
        openapi_extra=openapi.request_body(SubmitJobBody),
    )
    async def submit_job(request: Request, who: Principal = allow(Action.JOB_SUBMIT)) -> Response:
        return await submit(ops, request)  # served by submit_route, which is matched first

    @router.get(
        "/v1/jobs/{job_id}",
        summary="Read a job",
        responses={**answer(200, "The job", JobView), **_NOT_FOUND, **_INVALID},
    )
    async def get_job(job_id: str, who: Principal = allow(Action.JOB_READ)) -> Response:
        return json_response(await ops.get(job_id, tenant_filter(who, Action.JOB_READ, None)))

    @router.get(
        "/v1/jobs",
        summary="List jobs, newest first, a page at a time",
        description="Pass `next_cursor` back as `cursor` (with the same filters) for the next page; it is null "
        "after the last page. Jobs submitted during a walk do not shift it: nothing is returned twice or skipped. "
        "`submitted_after` (inclusive) and `submitted_before` (exclusive) take a date (00:00 UTC), an ISO 8601 "
        "time or Unix seconds. A page filtered by time may hold fewer than `limit` jobs and still have a next page.",
        responses={**answer(200, "A page of jobs", JobList), **_INVALID, **_BAD_CURSOR, **_FORBIDDEN},
    )
    async def list_jobs(
        who: Principal = allow(Action.JOB_LIST),
        tenant: str | None = None,
        status: str | None = Query(None, description="One of: " + ", ".join(JOB_STATUSES)),
        submitted_after: str | None = Query(None, description="Only jobs submitted at or after this time."),
        submitted_before: str | None = Query(None, description="Only jobs submitted before this time."),
        limit: int = Query(100, ge=1, le=MAX_LIST_LIMIT),
        cursor: str | None = Query(None, description="`next_cursor` of the previous page."),
        archived: bool = Query(
            False,
            description="Also the jobs that left the projection (finished longer ago than their retention), "
            "read from the job archive in the same order.",
        ),
    ) -> Response:
        after_s = finance_api.window_bound("submitted_after", submitted_after)
        before_s = finance_api.window_bound("submitted_before", submitted_before)
        query, after = pages.job_request(who, tenant, status, after_s, before_s, cursor)
        return json_response(await pages.job_page(ops, query, limit, after, archived))

    @router.delete(
        "/v1/jobs/{job_id}",
        status_code=202,
        summary="Cancel a job",
        responses={
            **answer(202, "The cancel command is published", Cancelling),
            **_NOT_FOUND,
            **answer(409, "The job has already finished", ErrorBody),
            **_INVALID,
        },
    )
    async def cancel_job(job_id: str, who: Principal = allow(Action.JOB_CANCEL), reason: str | None = None) -> Response:
        problems = check_job_id(job_id)
        if reason is not None and not 0 < len(reason) <= MAX_REASON_CHARS:
            problems.append(ValidationError("reason", f"give 1-{MAX_REASON_CHARS} characters"))
        require_valid(problems)
        scope = tenant_filter(who, Action.JOB_CANCEL, None)
        job = await ops.cancel(job_id, scope, reason or "cancelled by user", actor=who.actor)
        return json_response(Cancelling(job_id=job.job_id, status="cancelling"), 202)

    @router.get(
        "/v1/nodes", summary="List nodes with state and free GPUs", responses=answer(200, "The nodes", NodeList)
    )
    async def list_nodes(
        who: Principal = allow(Action.NODE_LIST),
        limit: int | None = Query(None, ge=1, le=MAX_LIST_LIMIT, description="At most this many; default all."),
        cursor: str | None = Query(None, description="`next_cursor` of the previous page."),
    ) -> Response:
        nodes = await ops.nodes_caught_up.read(lambda: views.list_nodes(store))
        shown, following = pages.page_of(nodes, lambda n: n.node_id, "nodes", {}, limit, cursor)
        return json_response(NodeList(shown, following))

    @router.get(
        "/v1/usage",
        summary="GPU usage rows from accounting",
        description="Researchers and tenant-admins read their own tenant's usage; finance and admins read every "
        "tenant's (`tenant` picks one). `from`/`to` take a date (`to` includes that day), an ISO 8601 time or Unix "
        "seconds; `group_by` is a comma-separated list of tenant, queue, gpu_type, job.",
        responses={**_FORBIDDEN, **_INVALID, **answer(501, "No usage source is connected", ErrorBody)},
    )
    async def usage(
        who: Principal = allow(Action.USAGE_READ),
        tenant: str | None = None,
        start: str | None = Query(None, alias="from", description="Start of the window (inclusive)."),
        end: str | None = Query(None, alias="to", description="End of the window (a date includes that day)."),
        group_by: str | None = Query(None, description="Comma-separated: tenant, queue, gpu_type, job."),
    ) -> Response:
        require_valid(check_tenant_name(tenant))
        tenant = tenant_filter(who, Action.USAGE_READ, tenant)
        query = finance_api.usage_query(start, end, group_by)
        if usage_source is None:
            return error_response(
                501, "not_implemented", "usage is not available: this gateway has no usage source (accounting)"
            )
        rows = usage_source(tenant, **query)
        if inspect.isawaitable(rows):
            rows = await rows
        return json_response(rows)

    @router.get("/metrics", summary="Prometheus metrics", response_class=Response)
    async def prometheus(who: Principal = allow(Action.METRICS_READ)) -> Response:
        return Response(content=await metrics.render(store), media_type=CONTENT_TYPE)

    return router
