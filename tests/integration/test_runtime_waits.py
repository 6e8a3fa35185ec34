"""A service started before NATS and Redis waits for them instead of exiting."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from trainyard.local.servers import free_port, start_nats, start_redis
from trainyard.runtime import close_runtime, open_runtime
from trainyard.settings import Settings


async def wait_for_log(caplog: pytest.LogCaptureFixture, *texts: str, timeout: float = 30.0) -> None:
    """Until a log line holds one of ``texts``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not any(t in r.getMessage() for r in caplog.records for t in texts):
        assert loop.time() < deadline, f"no log line with any of {texts!r}"
        await asyncio.sleep(0.05)


async def test_a_service_waits_for_nats_and_redis_to_come_up(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="trainyard")
    nats_port, redis_port = free_port(), free_port()
    settings = Settings(nats_url=f"nats://127.0.0.1:{nats_port}", redis_url=f"redis://127.0.0.1:{redis_port}/0")
    opening = asyncio.create_task(open_runtime("waiter", settings))
    servers = []
    try:
        # The NATS client retries by itself (saying so); Redis is waited for here.
        await wait_for_log(caplog, f"NATS at {settings.nats_url} is not reachable", f"'127.0.0.1', {nats_port}")
        assert not opening.done()
        servers.append(await asyncio.to_thread(start_nats, tmp_path / "nats", nats_port))
        await wait_for_log(caplog, f"Redis at {settings.redis_url} is not reachable")
        assert not opening.done()
        servers.append(await asyncio.to_thread(start_redis, tmp_path / "redis", redis_port))
        rt = await asyncio.wait_for(opening, 60)
        try:
            assert await rt.store.redis.ping()
            assert (await rt.bus.js.stream_info("JOBS")).config.name == "JOBS"  # streams declared once NATS came
        finally:
            await close_runtime(rt)
    finally:
        opening.cancel()
        for server in servers:
            server.stop()


async def test_a_stop_while_waiting_ends_the_wait(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="trainyard")
    settings = Settings(nats_url=f"nats://127.0.0.1:{free_port()}")
    stop = asyncio.Event()
    opening = asyncio.create_task(open_runtime("waiter", settings, stop))
    await wait_for_log(caplog, "is not reachable", "Connect call failed")
    stop.set()
    with pytest.raises(ConnectionAbortedError, match="stopped while waiting for NATS"):
        await asyncio.wait_for(opening, 30)
