"""``<data dir>/state.json``: what a running ``trainyard up`` writes so that
other commands (``trainyard jobs``, ``config``, ``export``, ...) can find the
stack without starting anything."""

from __future__ import annotations

from pathlib import Path

import msgspec

from trainyard.local.credentials import ADMIN, BUS_DIR, load_credentials
from trainyard.local.servers import url_with_user


class StackState(msgspec.Struct):
    """What ``trainyard up`` writes so other commands can find the stack."""

    api_url: str
    grpc_target: str
    nats_url: str
    redis_url: str
    ledger_url: str
    pid: int
    locked_bus: bool = False  # NATS and Redis have users: the admin credential is in <data dir>/bus/
    metrics: dict[str, str] = {}  # service -> the URL of its Prometheus metrics


def state_path(data_dir: str | Path) -> Path:
    return Path(data_dir) / "state.json"


def write_state(data_dir: str | Path, state: StackState) -> None:
    state_path(data_dir).write_bytes(msgspec.json.format(msgspec.json.encode(state)))


def read_state(data_dir: str | Path) -> StackState | None:
    """The running stack's addresses; on a locked bus its NATS and Redis URLs
    carry the admin credential kept in the data directory, so commands run by
    the stack's owner reach them."""
    path = state_path(data_dir)
    if not path.exists():
        return None
    state = msgspec.json.decode(path.read_bytes(), type=StackState)
    credentials = load_credentials(Path(data_dir) / BUS_DIR) if state.locked_bus else None
    if credentials is None:
        return state
    nats, redis = credentials.nats_user(ADMIN), credentials.redis_user(ADMIN)
    return msgspec.structs.replace(
        state,
        nats_url=url_with_user(state.nats_url, nats.name, nats.password),
        redis_url=url_with_user(state.redis_url, redis.name, redis.password),
    )
