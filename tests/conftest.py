"""Shared fixtures: real nats-server (JetStream) and a real Redis-compatible
server on free loopback ports.  A server that cannot start fails the test."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from trainyard.bus import Bus, ensure_streams
from trainyard.local.servers import Server, start_nats, start_redis
from trainyard.store import Store
from trainyard.testing.auth import Callers, issue


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_redis(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[Server]:
    """A fresh JetStream server per test, so streams never leak between tests."""
    server = start_nats(tmp_path / "nats")
    yield server
    server.stop()


@pytest.fixture
async def bus(nats_server: Server) -> AsyncIterator[Bus]:
    b = await Bus.connect(nats_server.url, name="trainyard-test")
    await ensure_streams(b.js)
    yield b
    await b.close()


@pytest.fixture
def redis_prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}:"


@pytest.fixture
async def store(redis_server: Server, redis_prefix: str) -> AsyncIterator[Store]:
    s = Store.from_url(redis_server.url, redis_prefix)
    yield s
    await s.flush()
    await s.close()


@pytest.fixture
async def callers(bus: Bus) -> Callers:
    """An API token for each role (and tenant) in the bus's token store."""
    return await issue(bus)
