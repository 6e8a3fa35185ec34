"""Builders for admission tests: ``job(gpus=8, tenant="a")``, ``queue("a", H100=8)``."""

from __future__ import annotations

import itertools

from trainyard.core.admission import (
    AdmissionPolicy,
    AdmissionResult,
    AdmissionSnapshot,
    Cohort,
    FlavorQuota,
    PendingJob,
    PreemptionSettings,
    PriorityClass,
    QueueQuota,
    RunningJob,
    Tenancy,
    admit,
)
from trainyard.core.reasons import PendingReason

_orders = itertools.count(1)
NOW = 100_000.0


def quota(nominal: int = 0, borrow: int | None = None, lend: int | None = None) -> FlavorQuota:
    return FlavorQuota(nominal, borrow, lend)


def _quotas(spec: dict[str, int | tuple | FlavorQuota]) -> dict[str, FlavorQuota]:
    out = {}
    for t, v in spec.items():
        if isinstance(v, FlavorQuota):
            out[t] = v
        elif isinstance(v, tuple):
            out[t] = quota(*v)
        else:
            out[t] = quota(v)
    return out


def queue(tenant: str, name: str = "q", cohort: str | None = "org", weight: float = 1.0, **q) -> QueueQuota:
    """``queue("a", H100=8)``; a tuple is (nominal, borrowing limit, lending limit)."""
    return QueueQuota(tenant, name, cohort, _quotas(q), weight)


def cohort(name: str, parent: str | None = None, weight: float = 1.0, **q) -> Cohort:
    return Cohort(name, parent, _quotas(q), weight)


def tenancy(*queues: QueueQuota, cohorts: list[Cohort] | None = None, **settings) -> Tenancy:
    """Queues under one cohort ``org`` whose quota is the sum of theirs, unless cohorts are given."""
    if cohorts is None:
        total: dict[str, int] = {}
        for q in queues:
            for t, fq in q.quota.items():
                total[t] = total.get(t, 0) + fq.nominal
        cohorts = [cohort("org", **total)]
    preemption = PreemptionSettings(**settings)
    classes = [PriorityClass("high", 100, False), PriorityClass("low", 0), PriorityClass("be", -10, True, True)]
    return Tenancy(
        queues=list(queues), cohorts=cohorts, priority_classes=classes, half_life_s=3600.0, preemption=preemption
    )


def job(
    job_id: str | None = None,
    gpus: int = 8,
    tenant: str = "a",
    queue: str = "q",
    gpu: str = "H100",
    priority: int = 0,
    order: int | None = None,
    not_before: float | None = None,
    best_effort: bool = False,
    gpus_by_type: dict[str, int] | None = None,
    limit: float | None = None,
    attained: float = 0.0,
    submitted: float | None = None,
) -> PendingJob:
    order = next(_orders) if order is None else order
    return PendingJob(
        job_id or f"{tenant}-{order}",
        tenant,
        queue,
        order,
        gpus_by_type if gpus_by_type is not None else {gpu: gpus},
        priority,
        not_before,
        best_effort,
        runtime_limit_s=limit,
        attained_gpu_s=attained,
        submitted_at=submitted,
    )


def running(
    job_id: str,
    gpus: int = 8,
    tenant: str = "a",
    queue: str = "q",
    gpu: str = "H100",
    started: float = NOW - 7200,
    checkpoint: float | None = None,
    priority: int = 0,
    preemptible: bool = True,
    best_effort: bool = False,
    notice: float | None = None,
    ends: float | None = None,
    attained: float = 0.0,
) -> RunningJob:
    return RunningJob(
        job_id,
        tenant,
        queue,
        {gpu: gpus},
        started,
        checkpoint,
        priority,
        preemptible,
        best_effort,
        notice,
        expected_end=ends,
        attained_gpu_s=attained,
    )


def cycle(
    tree: Tenancy | None,
    pending: list[PendingJob],
    running_jobs: list[RunningJob] = (),
    capacity: dict[str, int] | None = None,
    history: dict[str, dict[str, float]] | None = None,
    recent: list[float] = (),
    now: float = NOW,
    **policy,
) -> AdmissionResult:
    """One admission cycle; capacity defaults to the top-level quota, in use to what running jobs hold."""
    if capacity is None:
        capacity = {}
        tops = [c for c in tree.cohorts if c.parent is None] + [q for q in tree.queues if q.cohort is None]
        for node in tops:
            for t, fq in node.quota.items():
                capacity[t] = capacity.get(t, 0) + fq.nominal
    in_use: dict[str, int] = {}
    for r in running_jobs:
        for t, n in r.gpus_by_type.items():
            in_use[t] = in_use.get(t, 0) + n
    snapshot = AdmissionSnapshot(
        pending=list(pending),
        capacity=capacity,
        in_use=in_use,
        running=list(running_jobs),
        usage_history=history or {},
        recent_preemptions=list(recent),
    )
    return admit(snapshot, AdmissionPolicy(tenancy=tree, **policy), now)


def admitted_ids(result: AdmissionResult) -> list[str]:
    return [a.job_id for a in result.admitted]


def reasons(result: AdmissionResult) -> dict[str, PendingReason]:
    return {w.job_id: w.reason for w in result.waiting}
