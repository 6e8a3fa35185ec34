"""Composition root of the gateway: REST (FastAPI under uvicorn) and gRPC in
front of the same job operations, with the NODES projection kept fresh in
this process so reads see the latest events, and the API tokens followed from
their KV bucket so a revocation applies within about a second."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator

import uvicorn

from trainyard.auth import Authenticator, JwtVerifier, TokenStore, jwt_config
from trainyard.bus import deadletters
from trainyard.ledger import Ledger
from trainyard.ledger.archive import JobArchive
from trainyard.runtime import Runtime, run_tasks, serve
from trainyard.settings import ConfigurationError, Settings
from trainyard.store import Projector
from trainyard.store.caught_up import CaughtUpReads
from trainyard_gateway import dlq_api, finance_api, logs_api, nodes_api
from trainyard_gateway.console import app as console_app
from trainyard_gateway.grpc_server import start_grpc
from trainyard_gateway.jobs import JobOperations
from trainyard_gateway.metrics import GatewayMetrics
from trainyard_gateway.rest import UsageSource, create_app
from trainyard_gateway.settings import gateway_settings

log = logging.getLogger("trainyard.gateway")


class HttpServer(uvicorn.Server):
    """uvicorn without its own signal handling: the runtime owns SIGTERM and
    SIGINT and stops the server through ``should_exit``."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def open_archive(settings: Settings) -> JobArchive | None:
    """The job archive in the ledger database: jobs read from it once they
    left the projection (finished, past ``TRAINYARD_JOB_RETENTION_S``)."""
    if not settings.ledger_url:
        return None
    archive = JobArchive(settings.ledger_url)
    archive.create_schema()  # idempotent; the gateway may start before admission
    return archive


def build_usage_source(settings: Settings) -> UsageSource | None:
    """``GET /v1/usage`` reads the accounting ledger at ``settings.ledger_url``:
    GPU-seconds inside [start, end) per group (tenant and GPU type unless
    asked otherwise), open runs metered up to now."""
    if not settings.ledger_url:
        return None
    ledger = Ledger(settings.ledger_url)
    ledger.create_schema()  # idempotent; the gateway may start before accounting

    def read(
        tenant: str | None,
        start: float | None = None,
        end: float | None = None,
        group_by: tuple[str, ...] = ("tenant", "gpu_type"),
    ) -> list[dict[str, object]]:
        totals = ledger.usage(tenant=tenant, start=start, end=end, group_by=group_by)
        return [
            dict(zip(group_by, key, strict=True)) | {"gpu_seconds": round(s, 3), "gpu_hours": round(s / 3600, 6)}
            for key, s in totals.items()
        ]

    async def usage(tenant: str | None, **query: object) -> list[dict[str, object]]:
        return await asyncio.to_thread(read, tenant, **query)  # type: ignore[arg-type]

    return usage


def http_server(app: object, host: str, port: int, grace_s: float) -> HttpServer:
    """uvicorn for the REST app, with httptools' C parser (a dependency): h11,
    in pure Python, costs a quarter more CPU per request."""
    config = uvicorn.Config(
        app,  # type: ignore[arg-type]
        host=host,
        port=port,
        http="httptools",
        log_level="warning",
        timeout_graceful_shutdown=int(grace_s),
    )
    return HttpServer(config)


def bind_http(host: str, port: int) -> socket.socket:
    """The REST listening socket. It is made with ``IPPROTO_TCP`` named: asyncio
    sets TCP_NODELAY on an accepted connection only when its socket says TCP,
    and without it every small response waits out the client's delayed ACK
    (about 40 ms on Linux) behind Nagle's algorithm."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise OSError(f"cannot listen for HTTP on {host}:{port}: {err.strerror}") from err
    sock.set_inheritable(True)
    return sock


async def _until_exit(http: asyncio.Task[None]) -> None:
    """Fail the gateway if the HTTP server stops on its own."""
    await asyncio.shield(http)
    raise RuntimeError("the HTTP server stopped")


async def open_authenticator(rt: Runtime) -> Authenticator:
    """API tokens from the KV bucket (loaded before the gateway serves), and
    JWTs when an issuer is configured; a bad JWT setting stops the gateway."""
    try:
        config = jwt_config(rt.settings)
    except ConfigurationError as err:
        raise SystemExit(f"trainyard-gateway: {err}") from err
    tokens = await TokenStore.open(rt.bus.js, replicas=rt.settings.stream_replicas)
    return Authenticator(tokens, JwtVerifier(config) if config else None)


SWEEP_EVERY_S = 3600.0


async def sweep_sessions(auth: Authenticator, stop: asyncio.Event) -> None:
    """Purge the records of console sessions that ended a day ago, hourly, until ``stop``."""
    while not stop.is_set():
        try:
            purged = await auth.sessions.sweep() if auth.sessions is not None else 0
        except Exception as err:  # noqa: BLE001 - NATS away or a record unread: the next hour sweeps
            log.warning("console sessions not swept: %r", err)
        else:
            if purged:
                log.info("purged %d ended console sessions", purged)
        try:
            await asyncio.wait_for(stop.wait(), SWEEP_EVERY_S)
        except TimeoutError:
            pass


async def main(rt: Runtime) -> None:
    gw = gateway_settings(rt.settings)
    archive = open_archive(rt.settings)
    ops = JobOperations(rt.bus, rt.store, archive=archive)
    auth = await open_authenticator(rt)
    assert auth.tokens is not None
    following = asyncio.create_task(auth.tokens.follow(rt.stop))
    loaded = asyncio.ensure_future(auth.tokens.ready.wait())
    await asyncio.wait([following, loaded], return_when=asyncio.FIRST_COMPLETED)  # serve once tokens are known
    loaded.cancel()
    metrics = GatewayMetrics(
        deadletters=lambda: deadletters.counts(rt.bus),
        caught_up=CaughtUpReads(rt.bus, rt.store, streams=("JOBS", "NODES")),
    )
    routers = [
        nodes_api.build_router(rt.bus, rt.store, rt.settings),
        finance_api.build_router(rt.bus, rt.store, rt.settings),
        console_app.build_router(ops, rt.store, auth, rt.settings),  # the web console at /
        dlq_api.build_router(rt.bus, rt.store, rt.settings),
        logs_api.build_router(rt.bus, rt.store, rt.settings),
    ]
    app = create_app(
        ops, rt.store, auth, usage_source=build_usage_source(rt.settings), metrics=metrics, routers=routers
    )

    try:
        sock = bind_http(gw.host, gw.http_port)
    except OSError as err:
        raise SystemExit(f"trainyard-gateway: {err} (set TRAINYARD_GATEWAY_HTTP_PORT)") from err
    http_port = sock.getsockname()[1]
    http = http_server(app, gw.host, http_port, gw.shutdown_grace_s)
    try:
        grpc_server = await start_grpc(ops, auth, gw.host, gw.grpc_port, metrics)
    except OSError as err:
        sock.close()
        raise SystemExit(f"trainyard-gateway: {err} (set TRAINYARD_GATEWAY_GRPC_PORT)") from err
    http_task = asyncio.create_task(http.serve(sockets=[sock]))
    log.info("REST API and console on http://%s:%d (OpenAPI at /docs, metrics at /metrics)", gw.host, http_port)
    try:
        await run_tasks(
            rt.stop,
            Projector(rt.bus, rt.store, "NODES").run(rt.stop),
            _until_exit(http_task),
            following,
            sweep_sessions(auth, rt.stop),
        )
    finally:
        http.should_exit = True
        await asyncio.gather(http_task, return_exceptions=True)
        sock.close()
        await grpc_server.stop(gw.shutdown_grace_s)


def run() -> None:
    serve("gateway", main)
