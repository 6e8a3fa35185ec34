"""Builders for the capacity-report tests: ledger records as plain values.

Times are hours after ``T0`` (2026-11-01T00:00:00Z) unless absolute.
"""

from __future__ import annotations

from trainyard.ledger.records import LedgerJob, LedgerRun

T0 = 1_793_491_200.0  # 2026-11-01T00:00:00Z
HOUR = 3_600.0
DAY = 86_400.0


def at(hours: float) -> float:
    return T0 + hours * HOUR


def job(
    job_id: str = "j1",
    tenant: str = "acme",
    gpus: int = 8,
    gpu_type: str = "H100",
    accepted: float = 0.0,
    cancelled: float | None = None,
) -> LedgerJob:
    return LedgerJob(
        job_id=job_id,
        tenant=tenant,
        queue="research",
        name=job_id,
        gpus_by_type={gpu_type: gpus},
        submitted_at=at(accepted),
        accepted_at=at(accepted),
        cancelled_at=at(cancelled) if cancelled is not None else None,
    )


def run(
    run_id: str = "r1",
    job_id: str = "j1",
    tenant: str = "acme",
    gpus: int = 8,
    gpu_type: str = "H100",
    placed: float | None = 0.0,
    started: float | None = None,
    ended: float | None = 1.0,
    outcome: str | None = "succeeded",
    lost_hours: float = 0.0,
) -> LedgerRun:
    """A run placed at ``placed`` hours, started then unless ``started`` says
    otherwise, ended at ``ended`` (None: still open)."""
    started = placed if started is None else started
    ended_at = at(ended) if ended is not None else None
    gpu_seconds = gpus * (ended_at - at(started)) if ended_at is not None and started is not None else None
    return LedgerRun(
        run_id=run_id,
        job_id=job_id,
        tenant=tenant,
        queue="research",
        priority_class="standard",
        name=job_id,
        labels={},
        attempt=1,
        cluster="c1",
        gpus=gpus,
        gpu_type=gpu_type,
        gpus_by_type={gpu_type: gpus},
        placed_at=at(placed) if placed is not None else None,
        started_at=at(started) if started is not None else None,
        ended_at=ended_at,
        outcome=outcome if ended is not None else None,
        gpu_seconds=gpu_seconds,
        lost_seconds=gpus * lost_hours * HOUR if ended is not None else None,
        idle_seconds=0.0,
    )
