"""Rows of the ledger as values: the run and job records queries return."""

from __future__ import annotations

from typing import Any

import msgspec

from trainyard.core.accounting.metering import overlap


class LedgerRun(msgspec.Struct, frozen=True, kw_only=True):
    """A run as the ledger holds it, with its job's attributes (None until
    the job's JobAccepted has been applied).  Usage is in GPU-seconds."""

    run_id: str
    job_id: str
    tenant: str
    queue: str | None
    priority_class: str | None
    name: str | None
    labels: dict[str, str]
    attempt: int | None
    cluster: str | None
    gpus: int
    gpu_type: str | None  # one type, or several joined by '+'
    gpus_by_type: dict[str, int]
    placed_at: float | None
    started_at: float | None
    ended_at: float | None  # None while the run is open
    outcome: str | None  # succeeded | failed:<reason> | cancelled; None while open
    gpu_seconds: float | None  # None while the run is open
    lost_seconds: float | None
    idle_seconds: float | None

    def gpu_seconds_in(self, start: float | None = None, end: float | None = None, now: float | None = None) -> float:
        """GPU-seconds inside [start, end); an open run is metered up to ``now``."""
        until = self.ended_at if self.ended_at is not None else now
        return self.gpus * overlap(self.started_at, until, start, end)


class LedgerJob(msgspec.Struct, frozen=True, kw_only=True):
    """A job as the ledger holds it.  Spec fields are None (and the GPU maps
    empty) until the job's JobAccepted has been applied."""

    job_id: str
    tenant: str
    queue: str | None
    name: str | None
    gpus_by_type: dict[str, int]  # GPUs the spec asks for, by GPU type
    submitted_at: float | None
    accepted_at: float | None  # when the job joined its queue
    cancelled_at: float | None  # the job's cancel: the first in log order

    @property
    def gpus(self) -> int:
        return sum(self.gpus_by_type.values())


def ledger_job_from_row(row: Any) -> LedgerJob:
    by_type: dict[str, int] = {}
    for gpu_type, gpus in (row["roles"] or {}).values():
        by_type[gpu_type] = by_type.get(gpu_type, 0) + int(gpus)
    return LedgerJob(
        job_id=row["job_id"],
        tenant=row["tenant"],
        queue=row["queue"],
        name=row["name"],
        gpus_by_type=dict(sorted(by_type.items())),
        submitted_at=row["submitted_at"],
        accepted_at=row["accepted_at"],
        cancelled_at=row["cancelled_at"],
    )


def ledger_run_from_row(row: Any) -> LedgerRun:
    return LedgerRun(
        run_id=row["run_id"],
        job_id=row["job_id"],
        tenant=row["tenant"],
        queue=row["queue"],
        priority_class=row["priority_class"],
        name=row["name"],
        labels=dict(row["labels"] or {}),
        attempt=row["attempt"],
        cluster=row["cluster"],
        gpus=row["gpus"],
        gpu_type=row["gpu_type"],
        gpus_by_type=dict(row["gpus_by_type"] or {}),
        placed_at=row["placed_at"],
        started_at=row["started_at"],
        ended_at=row["ended_at"],
        outcome=row["outcome"],
        gpu_seconds=row["gpu_seconds"],
        lost_seconds=row["lost_seconds"],
        idle_seconds=row["idle_seconds"],
    )
