"""The bus and Redis credentials of one installation, and the server files
made from them.

``trainyard up`` keeps them in ``<data dir>/bus/`` (mode 0700):
``credentials.json`` (every user's password, 0600), ``nats.conf`` (the users
and their permissions, 0600) and ``redis.acl`` (hashed passwords only).  They are made once
and kept across restarts; deleting the directory and starting again rotates
every password.  ``python -m trainyard.bus config --out DIR`` writes the same
files for compose.yaml, plus one ``<service>.env`` per service.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterable
from pathlib import Path

import msgspec

from trainyard.bus.permissions import AGENT, SERVICES, BusUser, nats_config, user_name
from trainyard.store.acl import redis_acl

CREDENTIALS_FILE = "credentials.json"
NATS_CONFIG_FILE = "nats.conf"
REDIS_ACL_FILE = "redis.acl"
ADMIN = "admin"
#: Where ``trainyard up`` keeps them, under its data directory.
BUS_DIR = "bus"


class Credentials(msgspec.Struct):
    nats: list[BusUser]
    redis: list[BusUser]

    def nats_user(self, name: str) -> BusUser:
        return _named(self.nats, name)

    def redis_user(self, name: str) -> BusUser:
        return _named(self.redis, name)

    def with_portals(self, tenants: Iterable[str]) -> Credentials:
        """These credentials plus a portal user for each tenant that has none."""
        have = {u.name for u in self.nats}
        added = [_new("portal", t) for t in dict.fromkeys(tenants) if user_name("portal", t) not in have]
        return Credentials(nats=[*self.nats, *added], redis=list(self.redis))

    def with_agents(self, nodes: Iterable[str]) -> Credentials:
        """These credentials plus a NATS user (``agent-<node>``) for each node that has none;
        a node agent needs no Redis user."""
        have = {u.name for u in self.nats}
        added = [
            BusUser(user_name(AGENT, node=n), secrets.token_urlsafe(24), AGENT, node=n)
            for n in dict.fromkeys(nodes)
            if user_name(AGENT, node=n) not in have
        ]
        return Credentials(nats=[*self.nats, *added], redis=list(self.redis))


def _named(users: list[BusUser], name: str) -> BusUser:
    for user in users:
        if user.name == name:
            return user
    raise KeyError(f"no user {name!r} in the credentials")


def _new(role: str, tenant: str | None = None) -> BusUser:
    return BusUser(user_name(role, tenant), secrets.token_urlsafe(24), role, tenant)


def new_credentials(tenants: Iterable[str] = ()) -> Credentials:
    """Fresh random passwords: a NATS and a Redis user per service and for
    admin, and a NATS user per tenant's submission portal."""
    roles = [*SERVICES, ADMIN]
    return Credentials(nats=[_new(r) for r in roles], redis=[_new(r) for r in roles]).with_portals(tenants)


def _write_private(path: Path, data: str | bytes, mode: int = 0o600) -> None:
    """Write ``path`` with ``mode`` (by default: its owner's only) from its first byte on."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
    os.chmod(path, mode)


def load_credentials(directory: Path) -> Credentials | None:
    path = Path(directory) / CREDENTIALS_FILE
    if not path.exists():
        return None
    return msgspec.json.decode(path.read_bytes(), type=Credentials)


def save_credentials(directory: Path, credentials: Credentials) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    path = directory / CREDENTIALS_FILE
    _write_private(path, msgspec.json.format(msgspec.json.encode(credentials)))
    return path


def ensure_credentials(directory: Path, tenants: Iterable[str] = ()) -> Credentials:
    """The credentials kept in ``directory``, made (and saved) on first use;
    portal users for ``tenants`` are added when missing."""
    tenants = list(tenants)
    found = load_credentials(directory)
    credentials = new_credentials(tenants) if found is None else found.with_portals(tenants)
    if credentials != found:
        save_credentials(directory, credentials)
    return credentials


def write_server_files(
    directory: Path, credentials: Credentials, redis_prefix: str = "ty:", cluster: str = "*", acl_mode: int = 0o600
) -> tuple[Path, Path]:
    """Write ``nats.conf`` (passwords in the clear: 0600) and ``redis.acl``
    (hashes only: 0600 for a local stack, whose servers run as its owner;
    compose's Redis reads it as a user of its own, so the deploy files pass
    0644, inside their 0700 directory); returns their paths."""
    directory = Path(directory)
    nats_path, acl_path = directory / NATS_CONFIG_FILE, directory / REDIS_ACL_FILE
    _write_private(nats_path, nats_config(credentials.nats, cluster))
    _write_private(acl_path, redis_acl(credentials.redis, redis_prefix), mode=acl_mode)
    return nats_path, acl_path


def service_env(credentials: Credentials, service: str) -> dict[str, str]:
    """The ``TRAINYARD_*`` settings that give ``service`` its users."""
    nats, redis = credentials.nats_user(service), credentials.redis_user(service)
    return {
        "TRAINYARD_NATS_USER": nats.name,
        "TRAINYARD_NATS_PASSWORD": nats.password,
        "TRAINYARD_REDIS_USER": redis.name,
        "TRAINYARD_REDIS_PASSWORD": redis.password,
    }


def write_deploy_files(
    directory: Path, credentials: Credentials, redis_prefix: str = "ty:", cluster: str = "*"
) -> list[Path]:
    """What compose.yaml mounts and reads: the server files and a
    ``<service>.env`` per service (in a 0700 directory)."""
    directory = Path(directory)
    save_credentials(directory, credentials)
    written = list(write_server_files(directory, credentials, redis_prefix, cluster, acl_mode=0o644))
    for service in SERVICES:
        path = directory / f"{service}.env"
        _write_private(path, "".join(f"{k}={v}\n" for k, v in service_env(credentials, service).items()))
        written.append(path)
    return written
