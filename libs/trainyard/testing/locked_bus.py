"""A locked nats-server (the generated users and permissions) for tests that
act as one credential against another, and a way to connect as any of them."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from trainyard.bus import Bus, ensure_streams
from trainyard.bus.permissions import inbox_prefix
from trainyard.local.credentials import ADMIN, Credentials, new_credentials, write_server_files
from trainyard.local.servers import start_nats

Connect = Callable[[str], Awaitable[Bus]]


@contextlib.asynccontextmanager
async def locked_bus(
    directory: Path, tenants: tuple[str, ...] = ("acme", "beta"), cluster: str = "local", agents: tuple[str, ...] = ()
) -> AsyncIterator[tuple[Connect, Credentials]]:
    """Start a locked nats-server under ``directory`` with users for every
    service, admin, a portal per tenant and a node agent (``agent-<node>``)
    per node of ``agents``; declare the streams as admin.
    Yields a function that connects as a named user the way a service does
    (its password and its own inbox prefix), and the credentials."""
    credentials = new_credentials(tenants=list(tenants)).with_agents(agents)
    config, _ = write_server_files(directory, credentials, cluster=cluster)
    admin = credentials.nats_user(ADMIN)
    server = start_nats(directory / "nats", config_file=config, admin=(admin.name, admin.password))
    opened: list[Bus] = []

    async def as_user(name: str) -> Bus:
        user = credentials.nats_user(name)
        bus = await Bus.connect(
            server.url, f"test-{name}", user=user.name, password=user.password, inbox_prefix=inbox_prefix(user.name)
        )
        opened.append(bus)
        return bus

    try:
        await ensure_streams((await as_user(ADMIN)).js)
        yield as_user, credentials
    finally:
        try:
            for bus in opened:
                await bus.close()
        finally:
            server.stop()
