"""One admission cycle.

The walking-skeleton policy: first-in-first-out per GPU type while GPUs are
free.  A job whose GPU type is blocked by an earlier job waits behind it, so a
large job is never overtaken by smaller ones of the same type.
"""

from __future__ import annotations

import msgspec

from trainyard.core.reasons import PendingReason


class PendingJob(msgspec.Struct, frozen=True):
    job_id: str
    tenant: str
    queue: str
    order: int  # position in the global submission order (lower runs first)
    gpus_by_type: dict[str, int]  # the whole gang's demand
    priority: int = 0


class AdmissionSnapshot(msgspec.Struct, frozen=True):
    pending: list[PendingJob]
    capacity: dict[str, int]  # GPUs of each type on schedulable nodes
    in_use: dict[str, int]  # GPUs of each type held by admitted, placed and running jobs


class AdmissionPolicy(msgspec.Struct, frozen=True):
    max_admissions_per_cycle: int = 10_000


class Admit(msgspec.Struct, frozen=True):
    job_id: str


class Waiting(msgspec.Struct, frozen=True):
    job_id: str
    reason: PendingReason
    position: int  # 1-based place among pending jobs of the same GPU type


class AdmissionResult(msgspec.Struct, frozen=True):
    admitted: list[Admit]
    waiting: list[Waiting]


def admit(snapshot: AdmissionSnapshot, policy: AdmissionPolicy, now: float) -> AdmissionResult:
    """Admit pending jobs in submission order while their GPU types have room."""
    # 1. Free GPUs per type, from our own copy of the snapshot.
    free = {t: snapshot.capacity.get(t, 0) - snapshot.in_use.get(t, 0) for t in snapshot.capacity}
    blocked: set[str] = set()  # types whose head-of-line job did not fit
    positions: dict[str, int] = {}
    admitted: list[Admit] = []
    waiting: list[Waiting] = []
    # 2. Walk the queue in order; a job fits only if every GPU type it needs fits.
    for job in sorted(snapshot.pending, key=lambda j: (j.order, j.job_id)):
        types = job.gpus_by_type
        position = max((positions.get(t, 0) for t in types), default=0) + 1
        for t in types:
            positions[t] = positions.get(t, 0) + 1
        reason = _blocking_reason(job, snapshot.capacity, free, blocked)
        if reason is None and len(admitted) >= policy.max_admissions_per_cycle:
            reason = PendingReason.QUEUED_BEHIND
        if reason is not None:
            waiting.append(Waiting(job.job_id, reason, position))
            if reason in (PendingReason.INSUFFICIENT_GPUS, PendingReason.QUEUED_BEHIND):
                blocked.update(types)  # jobs that can never run do not hold up the line
            continue
        # 3. Take the GPUs for the whole gang.
        for t, n in types.items():
            free[t] -= n
        admitted.append(Admit(job.job_id))
    return AdmissionResult(admitted=admitted, waiting=waiting)


def _blocking_reason(
    job: PendingJob, capacity: dict[str, int], free: dict[str, int], blocked: set[str]
) -> PendingReason | None:
    for t, n in job.gpus_by_type.items():
        if capacity.get(t, 0) <= 0:
            return PendingReason.NO_CAPACITY_OF_TYPE
        if n > capacity[t]:
            return PendingReason.GANG_LARGER_THAN_CLUSTER
    if any(t in blocked for t in job.gpus_by_type):
        return PendingReason.QUEUED_BEHIND
    if any(n > free.get(t, 0) for t, n in job.gpus_by_type.items()):
        return PendingReason.INSUFFICIENT_GPUS
    return None
