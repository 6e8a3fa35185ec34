"""Builders for job lifecycle events, for the accounting tests.

Times are seconds after ``T0`` (2026-11-01T00:00:00Z) unless a test passes
absolute times.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from trainyard.domain.job import JobSpec, Role
from trainyard.events.jobs import (
    JobAccepted,
    JobAdmitted,
    JobCancelled,
    JobEvent,
    JobPlaced,
    ReplicaPlacement,
    RunFailed,
    RunStarted,
    RunSucceeded,
)

T0 = 1_793_491_200.0  # 2026-11-01T00:00:00Z
DEC1 = 1_796_083_200.0  # 2026-12-01T00:00:00Z
MINUTE = 60.0
HOUR = 3600.0


def spec(
    tenant: str = "acme",
    queue: str = "research",
    gpus: int = 8,
    gpu_type: str = "H100",
    labels: dict[str, str] | None = None,
    roles: Sequence[Role] | None = None,
    name: str = "train",
) -> JobSpec:
    if roles is None:
        per = min(gpus, 8)
        roles = [Role(name="trainer", replicas=max(1, gpus // per), gpus_per_replica=per, gpu_type=gpu_type)]
    return JobSpec(
        tenant=tenant,
        queue=queue,
        roles=list(roles),
        name=name,
        labels=labels or {"team": "vision"},
        simulated_duration_s=60.0,
    )


def accepted(job: str = "j1", at: float = T0, **spec_kwargs) -> JobAccepted:
    return JobAccepted(at=at, job_id=job, spec=spec(**spec_kwargs), submitted_at=at)


def admitted(run: str = "r1", job: str = "j1", tenant: str = "acme", at: float = T0, attempt: int = 1) -> JobAdmitted:
    return JobAdmitted(at=at, job_id=job, tenant=tenant, run_id=run, attempt=attempt)


def placed(
    run: str = "r1",
    job: str = "j1",
    tenant: str = "acme",
    at: float = T0,
    gpus: int = 8,
    role: str = "trainer",
    per_node: int = 8,
) -> JobPlaced:
    replicas = []
    for rank, first in enumerate(range(0, gpus, per_node)):
        count = min(per_node, gpus - first)
        replicas.append(
            ReplicaPlacement(role=role, replica=rank, rank=rank, node_id=f"n{rank}", gpus=list(range(count)))
        )
    return JobPlaced(at=at, job_id=job, tenant=tenant, run_id=run, cluster="c1", replicas=replicas)


def started(run: str = "r1", job: str = "j1", tenant: str = "acme", at: float = T0) -> RunStarted:
    return RunStarted(at=at, job_id=job, tenant=tenant, run_id=run)


def succeeded(run: str = "r1", job: str = "j1", tenant: str = "acme", at: float = T0) -> RunSucceeded:
    return RunSucceeded(at=at, job_id=job, tenant=tenant, run_id=run)


def failed(
    run: str = "r1", job: str = "j1", tenant: str = "acme", at: float = T0, reason: str = "preempted"
) -> RunFailed:
    return RunFailed(at=at, job_id=job, tenant=tenant, run_id=run, reason=reason)  # type: ignore[arg-type]


def cancelled(job: str = "j1", tenant: str = "acme", at: float = T0, run: str | None = None) -> JobCancelled:
    return JobCancelled(at=at, job_id=job, tenant=tenant, run_id=run)


def lifecycle(
    run: str = "r1",
    job: str = "j1",
    tenant: str = "acme",
    gpus: int = 8,
    placed_at: float = T0,
    started_at: float | None = T0,
    ended_at: float | None = T0 + HOUR,
    outcome: str = "succeeded",
    accept: bool = True,
    gpu_type: str = "H100",
) -> list[JobEvent]:
    """Every event of one run, in order: accepted (optional), admitted,
    placed, started, and the terminal event named by ``outcome``
    ("succeeded", "cancelled" or a failure reason such as "preempted")."""
    events: list[JobEvent] = []
    if accept:
        events.append(accepted(job, at=placed_at - 1, tenant=tenant, gpus=gpus, gpu_type=gpu_type))
    events += [admitted(run, job, tenant, at=placed_at - 0.5), placed(run, job, tenant, at=placed_at, gpus=gpus)]
    if started_at is not None:
        events.append(started(run, job, tenant, at=started_at))
    if ended_at is not None:
        if outcome == "succeeded":
            events.append(succeeded(run, job, tenant, at=ended_at))
        elif outcome == "cancelled":
            events.append(cancelled(job, tenant, at=ended_at, run=run))
        else:
            events.append(failed(run, job, tenant, at=ended_at, reason=outcome))
    return events


def numbered(events: Iterable[JobEvent], first: int = 1) -> list[tuple[str, JobEvent]]:
    """Pair events with stream sequences, as the JetStream consumer does."""
    return [(str(i), event) for i, event in enumerate(events, start=first)]
