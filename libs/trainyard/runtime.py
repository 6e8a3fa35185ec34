"""What every Trainyard process does at start and stop: settings, logging,
connections, streams, and a stop event set by SIGTERM / SIGINT."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import ssl
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import nats.errors
import redis.exceptions

from trainyard.bus import Bus, ensure_streams
from trainyard.bus.permissions import inbox_prefix
from trainyard.observability import logs
from trainyard.settings import ConfigurationError, Settings, load_settings
from trainyard.store import Store

log = logging.getLogger("trainyard")
T = TypeVar("T")


class Runtime:
    def __init__(self, name: str, settings: Settings, bus: Bus, store: Store, stop: asyncio.Event) -> None:
        self.name = name
        self.settings = settings
        self.bus = bus
        self.store = store
        self.stop = stop


async def open_runtime(name: str, settings: Settings, stop: asyncio.Event | None = None) -> Runtime:
    """Connect to NATS and Redis, waiting (with backoff, saying so) for
    either that is not up yet: a service started before them, or while one
    restarts, waits instead of exiting."""
    stop = stop or asyncio.Event()
    bus = await _until_up(stop, "NATS", settings.nats_url, lambda: _open_bus(name, settings))
    store = Store.from_url(settings.redis_url, settings.redis_prefix, **redis_options(settings))
    await _until_up(stop, "Redis", settings.redis_url, store.redis.ping)
    return Runtime(name, settings, bus, store, stop)


def nats_options(settings: Settings) -> dict[str, Any]:
    """The NATS client's options for this process's bus user and TLS: with a
    user, replies come on the user's own inbox (its permissions allow no other)."""
    options: dict[str, Any] = {}
    if settings.nats_user:
        options.update(
            user=settings.nats_user, password=settings.nats_password, inbox_prefix=inbox_prefix(settings.nats_user)
        )
    if settings.nats_tls_ca or settings.nats_tls_cert:
        options["tls"] = tls_context(settings.nats_tls_ca, settings.nats_tls_cert, settings.nats_tls_key)
    return options


def redis_options(settings: Settings) -> dict[str, Any]:
    """The Redis client's options for this process's ACL user and TLS (with a rediss:// URL)."""
    options: dict[str, Any] = {}
    if settings.redis_user:
        options.update(username=settings.redis_user, password=settings.redis_password)
    if settings.redis_tls_ca:
        options["ssl_ca_certs"] = settings.redis_tls_ca
    if settings.redis_tls_cert:
        options.update(ssl_certfile=settings.redis_tls_cert, ssl_keyfile=settings.redis_tls_key)
    return options


def tls_context(ca: str, cert: str, key: str) -> ssl.SSLContext:
    """Verify the server against ``ca`` (the system's CAs when empty); present
    ``cert`` and ``key`` when given."""
    context = ssl.create_default_context(cafile=ca or None)
    if cert:
        context.load_cert_chain(cert, key)
    return context


async def _open_bus(name: str, settings: Settings) -> Bus:
    bus = await Bus.connect(
        settings.nats_url, name=f"trainyard-{name}", group_commit=settings.nats_group_commit, **nats_options(settings)
    )
    try:
        await ensure_streams(bus.js, replicas=settings.stream_replicas)
    except BaseException:
        await bus.close()
        raise
    return bus


async def _until_up(stop: asyncio.Event, what: str, url: str, connect: Callable[[], Awaitable[T]]) -> T:
    delay = 0.2
    while True:
        attempt = asyncio.ensure_future(connect())
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait([attempt, stopped], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        if not attempt.done():  # stopped while the client itself keeps retrying
            attempt.cancel()
            await asyncio.gather(attempt, return_exceptions=True)
            raise ConnectionAbortedError(f"stopped while waiting for {what} at {url}")
        try:
            return attempt.result()
        except (
            TimeoutError,
            OSError,
            nats.errors.Error,
            redis.exceptions.ConnectionError,
            redis.exceptions.TimeoutError,
        ) as err:
            if stop.is_set():
                raise
            log.warning("%s at %s is not reachable (%r); trying again in %.1fs", what, url, err, delay)
            try:
                await asyncio.wait_for(stop.wait(), delay)
            except TimeoutError:
                pass
            delay = min(delay * 2, 5.0)


async def close_runtime(rt: Runtime) -> None:
    await rt.store.close()
    await rt.bus.close()


def serve(name: str, main: Callable[[Runtime], Awaitable[None]]) -> None:
    """Run ``main`` as the process ``name`` until SIGTERM or SIGINT."""
    try:
        settings = load_settings()
    except ConfigurationError as err:
        print(f"trainyard-{name}: {err}", file=sys.stderr)
        raise SystemExit(2) from err
    try:
        logs.configure(name, settings.log_level, settings.log_format)
    except ValueError as err:
        print(f"trainyard-{name}: {err}", file=sys.stderr)
        raise SystemExit(2) from err

    async def _run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        rt = await open_runtime(name, settings, stop)
        log.info("%s started (nats %s, redis %s)", name, settings.nats_url, settings.redis_url)
        try:
            await main(rt)
        except Exception:
            log.exception("%s failed", name)  # in its own log, not only on a stderr nobody reads
            raise
        finally:
            await close_runtime(rt)
            log.info("%s stopped", name)

    profile_to = settings.profile_dir
    if not profile_to:
        run_loop(settings, _run())
        return
    import cProfile
    import time

    profiler = cProfile.Profile(time.process_time)  # CPU time: waits and other processes' turns are not counted
    try:
        profiler.runcall(run_loop, settings, _run())
    finally:
        profiler.dump_stats(os.path.join(profile_to, f"{name}.prof"))


def loop_factory(settings: Settings) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop ``settings.event_loop`` names (None: the standard library's)."""
    if settings.event_loop == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return None


def run_loop(settings: Settings, main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to the end on the event loop the settings choose."""
    with asyncio.Runner(loop_factory=loop_factory(settings)) as runner:
        return runner.run(main)


async def run_tasks(stop: asyncio.Event, *coros: Awaitable[None]) -> None:
    """Run long-lived tasks until ``stop``; if one dies, stop them all and re-raise."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    stopper = asyncio.ensure_future(stop.wait())
    try:
        done, _ = await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
        for t in done:
            if t is not stopper and t.exception():
                raise t.exception()  # type: ignore[misc]
    finally:
        stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        stopper.cancel()
