"""Helpers of the executor tests: an outbox that keeps the reports in a list
(tests/integration/test_agent_execution.py runs the same executor over a real
bus), order builders, and the live members of a process group."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainyard.events.work import ProcessesStarted, ProcessExited, ProcessLaunch, StartRun, WorkReport
from trainyard.testing.waiting import eventually


class Reports:
    """An outbox that keeps every report, in order, and calls back at once."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, WorkReport]] = []

    def put(self, report: WorkReport, msg_id: str, on_sent: Callable[[], None] | None = None) -> None:
        self.sent.append((msg_id, report))
        if on_sent is not None:
            on_sent()

    def of(self, kind: type, run_id: str | None = None) -> list[Any]:
        return [r for _, r in self.sent if isinstance(r, kind) and (run_id is None or r.run_id == run_id)]

    async def exits(self, run_id: str, count: int, timeout: float = 30.0) -> dict[int, ProcessExited]:
        async def done() -> dict[int, ProcessExited] | None:
            got = {r.rank: r for r in self.of(ProcessExited, run_id)}
            return got if len(got) >= count else None

        return await eventually(done, timeout, what=f"{count} exits of {run_id}")

    async def started(self, run_id: str, timeout: float = 30.0) -> ProcessesStarted:
        async def done() -> ProcessesStarted | None:
            got = self.of(ProcessesStarted, run_id)
            return got[0] if got else None

        return await eventually(done, timeout, what=f"{run_id} started")


def launch(
    rank: int, *argv: str, gpus: list[int] | None = None, env: dict[str, str] | None = None, **kw: Any
) -> ProcessLaunch:
    return ProcessLaunch(
        rank=rank,
        role="trainer",
        replica=rank,
        gpus=gpus if gpus is not None else [rank],
        argv=list(argv),
        env=env or {},
        **kw,
    )


def order(run_id: str, *processes: ProcessLaunch, **kw: Any) -> StartRun:
    return StartRun(
        at=kw.pop("at", time.time()),
        job_id=f"job-{run_id}",
        tenant=kw.pop("tenant_", "acme"),
        run_id=run_id,
        node_id="n1",
        attempt=kw.pop("attempt", 1),
        cluster="local",
        processes=list(processes),
        **kw,
    )


def group_members(pgid: int) -> list[int]:
    """Every process in /proc whose process group is ``pgid``, but zombies (they
    run nothing; orphans wait for init to reap them, which here can take a second)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != b"Z":
            found.append(int(entry))
    return found
