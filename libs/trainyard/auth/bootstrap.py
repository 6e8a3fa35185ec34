"""The local stack's admin token: ``trainyard up`` makes one on its first
start, keeps the secret in ``<data_dir>/admin-token`` (mode 0600) and reuses
it on later starts while it still verifies."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
from pathlib import Path

from trainyard.auth.principal import Role, Unauthenticated
from trainyard.auth.tokens import BUCKET, TokenStore
from trainyard.bus.audit import audit
from trainyard.bus.connection import Bus
from trainyard.bus.streams import ensure_streams, wait_for_leaders

ADMIN_TOKEN_FILE = "admin-token"
ADMIN_TOKEN_NAME = "local-admin"
BOOTSTRAP_ACTOR = "service:trainyard-up"


def admin_token_path(data_dir: str | Path) -> Path:
    return Path(data_dir) / ADMIN_TOKEN_FILE


def read_admin_token(data_dir: str | Path) -> str | None:
    """The local stack's admin token, or None when there is none to read."""
    try:
        text = admin_token_path(data_dir).read_text().strip()
    except OSError:
        return None
    return text or None


def write_secret(path: Path, secret: str) -> None:
    """Write ``secret`` readable by its owner only (0600, also when the file existed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, (secret + "\n").encode())
    finally:
        os.close(fd)


async def ensure_admin_token(bus: Bus, data_dir: str | Path, replicas: int = 1) -> tuple[str, bool]:
    """The admin token in ``<data_dir>/admin-token``: the one there if it still
    verifies, else a new one (written there).  Returns ``(token, created)``."""
    await ensure_streams(bus.js, replicas=replicas)  # the audit record needs AUDIT on a fresh server
    store = await TokenStore.open(bus.js, replicas=replicas)
    await wait_for_leaders(bus.js, [f"KV_{BUCKET}", "AUDIT"])  # made just now on a first start
    existing = read_admin_token(data_dir)
    if existing is not None:
        try:
            who = await store.verify(existing)
        except Unauthenticated:
            pass  # revoked, expired, or the bucket was lost: make a new one
        else:
            if who.role is Role.ADMIN:
                admin_token_path(data_dir).chmod(0o600)
                return existing, False
    record, token = await store.create(ADMIN_TOKEN_NAME, Role.ADMIN, None, created_by=BOOTSTRAP_ACTOR)
    write_secret(admin_token_path(data_dir), token)
    await audit(
        bus,
        BOOTSTRAP_ACTOR,
        "token.create",
        record.id,
        "the local stack's admin token",
        details={"name": record.name, "role": record.role.value},
        record_id=f"audit:token:create:{record.id}",
    )
    return token, True


def ensure_admin_token_at(nats_url: str, data_dir: str | Path, replicas: int = 1) -> tuple[str, bool]:
    """:func:`ensure_admin_token` from synchronous code (``trainyard up``),
    in a thread of its own so it works whether or not a loop is running."""

    async def run() -> tuple[str, bool]:
        bus = await Bus.connect(nats_url, name="trainyard-up")
        try:
            return await ensure_admin_token(bus, data_dir, replicas)
        finally:
            await bus.close()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, run()).result()
