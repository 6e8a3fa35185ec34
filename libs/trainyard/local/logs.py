"""The log of each process a local stack starts, ``<data dir>/logs/<name>.log``:
where it is, whether a service has said it is ready, and its last lines."""

from __future__ import annotations

from pathlib import Path

#: Every service logs this line once it is connected to NATS and Redis (at INFO).
READY_MARKER = "{name} started ("


def log_path(data_dir: Path, name: str) -> Path:
    return data_dir / "logs" / f"{name}.log"


def log_size(data_dir: Path, name: str) -> int:
    """How long the log is now (0: none yet), so a start looks only at what follows."""
    try:
        return log_path(data_dir, name).stat().st_size
    except OSError:
        return 0


def logged_ready(data_dir: Path, name: str, offset: int) -> bool:
    """Whether ``name`` has logged :data:`READY_MARKER` past ``offset``."""
    try:
        with open(log_path(data_dir, name), "rb") as f:
            f.seek(offset)
            return READY_MARKER.format(name=name).encode() in f.read()
    except OSError:
        return False


def log_tail(data_dir: Path, name: str, lines: int = 30) -> str:
    path = log_path(data_dir, name)
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
