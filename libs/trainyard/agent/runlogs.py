"""Per-rank log files of runs, their rotation, and reads for ``logs`` requests.

Every process writes its own stdout and stderr (the shim opens the file with
``O_APPEND`` and hands it to the process), so logs keep growing across an
agent restart and never pass through the agent:

    <state>/logs/<job_id>/attempt-<n>/rank-<r>.log      the current file
    <state>/logs/<job_id>/attempt-<n>/rank-<r>.log.1    the previous part

A file past ``max_bytes`` is copied to ``.1`` (replacing the older part) and
truncated in place (copy-truncate: the writer's ``O_APPEND`` descriptor goes
on writing at the new end).  Lines written between the copy and the truncate
can be lost; that is the price of never reopening the process's descriptor.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from trainyard.events.subjects import token

#: What a ``logs`` reply carries at most.
MAX_READ_BYTES = 256 * 1024
#: The tail a ProcessExited report carries.
TAIL_LINES = 40
TAIL_BYTES = 4096


def log_path(state_dir: Path, job_id: str, attempt: int, rank: int) -> Path:
    if attempt < 0 or rank < 0:
        raise ValueError("attempt and rank are numbers from 0")
    return state_dir / "logs" / token(job_id) / f"attempt-{attempt}" / f"rank-{rank}.log"


def rotate(path: Path, max_bytes: int) -> bool:
    """Copy-truncate ``path`` to ``path.1`` when it is over ``max_bytes``."""
    try:
        if path.stat().st_size <= max_bytes:
            return False
    except FileNotFoundError:
        return False
    shutil.copyfile(path, path.with_name(path.name + ".1"))
    os.truncate(path, 0)
    return True


def tail(path: Path, lines: int = TAIL_LINES, max_bytes: int = TAIL_BYTES) -> str:
    """The last ``lines`` lines of ``path``, at most ``max_bytes`` bytes of them."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read(max_bytes)
    except FileNotFoundError:
        return ""
    kept = data.splitlines(keepends=True)[-lines:]
    if size > max_bytes and len(kept) > 1 and len(b"".join(kept)) == len(data):
        kept = kept[1:]  # the first line was cut by the byte limit
    return b"".join(kept).decode(errors="replace")


def read(state_dir: Path, job_id: str, attempt: int, rank: int, offset: int, limit: int) -> tuple[bytes, int]:
    """Up to ``limit`` bytes of a rank's current log file from ``offset``
    (negative: that many bytes before the end) and the file's size.
    Raises ValueError for a bad request, FileNotFoundError for no such log."""
    if limit <= 0:
        raise ValueError("limit must be positive")
    path = log_path(state_dir, job_id, attempt, rank)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        start = max(0, size + offset) if offset < 0 else min(offset, size)
        f.seek(start)
        return f.read(min(limit, MAX_READ_BYTES)), size
