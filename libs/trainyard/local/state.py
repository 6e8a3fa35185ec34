"""``<data dir>/state.json``: what a running ``trainyard up`` writes so that
other commands (``trainyard jobs``, ``config``, ``export``, ...) can find the
stack without starting anything; and the data directory kept private
(:func:`private_data_dir`)."""

from __future__ import annotations

import os
import stat
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


#: Bits a file or folder of the data directory never has: nothing for the group or others.
_OPEN_TO_OTHERS = stat.S_IRWXG | stat.S_IRWXO


def private_data_dir(data_dir: str | Path) -> list[Path]:
    """Make ``data_dir`` private to its owner, and keep it so.

    The data directory holds the ledger, every process's log, Redis's
    append-only file (every tenant's job specs), the JetStream store, the ACL
    file and the admin token.  It is created 0700 if missing; a directory left
    by an earlier version loses every group and other permission bit
    (folders become 0700, files 0600), following no symbolic link; and the
    process's umask becomes 0077, so what it and the servers and services it
    starts create later (which inherit the umask) is private too.  Returns the
    paths whose mode it changed."""
    os.umask(0o077)
    root = Path(data_dir)
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    changed = []
    inside = [Path(top) / name for top, dirs, files in os.walk(root) for name in (*dirs, *files)]  # no link followed
    for path in [root, *inside]:
        try:
            mode = path.lstat().st_mode
        except FileNotFoundError:  # removed meanwhile (a server's temporary file)
            continue
        if stat.S_ISLNK(mode) or not mode & _OPEN_TO_OTHERS:
            continue
        os.chmod(path, stat.S_IMODE(mode) & ~_OPEN_TO_OTHERS)
        changed.append(path)
    return changed


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
