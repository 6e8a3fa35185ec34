"""What one admission cycle reads and what it decides.

Queues are named ``"<tenant>/<queue>"`` wherever a map is keyed by queue
(``usage_history``); ``tenant`` is the team and ``queue`` one of its queues,
exactly as in ``JobSpec.tenant`` and ``JobSpec.queue``.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from trainyard.core.admission.tree import Tenancy
from trainyard.core.placement.snapshot import ClusterSnapshot
from trainyard.core.reasons import PendingReason, PreemptionReason
from trainyard.domain.job import JobSpec


def queue_key(tenant: str, queue: str) -> str:
    """The name a queue goes by in snapshot maps."""
    return f"{tenant}/{queue}"


class PendingJob(msgspec.Struct, frozen=True, gc=False):
    job_id: str
    tenant: str
    queue: str
    order: int  # position in the global submission order (lower runs first)
    gpus_by_type: dict[str, int]  # the whole gang's demand
    priority: int = 0  # from the job's priority class; higher runs first within its queue
    not_before: float | None = None  # backoff after a failed gang placement: not admitted before this time
    may_only_borrow: bool = False  # best-effort class: runs only on capacity others lend, first to be reclaimed
    runtime_limit_s: float | None = None  # the user's run-time limit: backfill plans with it; None: no limit
    attained_gpu_s: float = 0.0  # GPU-seconds its earlier runs received (least-attained-service order)
    submitted_at: float | None = None  # when it was submitted (aging)


class RunningJob(msgspec.Struct, frozen=True, gc=False):
    """A job that holds GPUs: admitted, placed or running."""

    job_id: str
    tenant: str
    queue: str
    gpus_by_type: dict[str, int]
    started_at: float  # when the current run was admitted
    last_checkpoint_at: float | None = None  # work since then is lost if the run is preempted
    priority: int = 0
    preemptible: bool = True
    may_only_borrow: bool = False
    notice_at: float | None = None  # already told to stop (preemption notice); its GPUs free up soon
    expected_end: float | None = None  # started_at + run-time limit; None: no limit (backfill plans with it)
    attained_gpu_s: float = 0.0  # GPU-seconds of its earlier runs (the current one is counted from started_at)


class AdmissionSnapshot(msgspec.Struct, frozen=True):
    pending: list[PendingJob]
    capacity: dict[str, int]  # GPUs of each type on schedulable nodes
    in_use: dict[str, int]  # GPUs of each type held by admitted, placed and running jobs
    running: list[RunningJob] = []  # the jobs holding ``in_use``; quota usage is derived from them
    usage_history: dict[str, dict[str, float]] = {}  # queue -> GPU type -> decayed GPU-seconds
    recent_preemptions: list[float] = []  # when recent fair-share preemption notices were given
    # Where the GPUs are: with it, a job preempts only runs that free one domain it can then be placed in
    # (placement's select_victims); None: victims are chosen by GPU counts alone.
    cluster: ClusterSnapshot | None = None
    specs: Mapping[str, JobSpec] = {}  # job id -> spec of pending jobs that may preempt (needed with ``cluster``)
    # ``pending`` lists each queue's jobs in admission order already (``ordering.group_pending``'s: priority, then
    # service rank, then submission order): they are taken as given instead of sorted again
    pending_in_order: bool = False


class AdmissionPolicy(msgspec.Struct, frozen=True):
    max_admissions_per_cycle: int = 10_000
    tenancy: Tenancy | None = None  # quota tree, priority classes, preemption; None: FIFO while GPUs are free
    max_preemptors_per_cycle: int = 64  # waiting jobs that may look for victims in one cycle


class Admit(msgspec.Struct, frozen=True, gc=False):
    job_id: str


class Waiting(msgspec.Struct, frozen=True, gc=False):
    job_id: str
    reason: PendingReason
    # 1-based place: among pending jobs of the same GPU type (no tenancy), or
    # in the job's own queue (with a tenancy)
    position: int


class Preemption(msgspec.Struct, frozen=True):
    """Tell a running job to stop (after its grace period) to make room."""

    job_id: str  # the victim
    preemptor: str  # the waiting job the room is for
    reason: PreemptionReason
    grace_period_s: float = 0.0
    lost_gpu_seconds: float = 0.0  # GPU time since the victim's last checkpoint


class AdmissionResult(msgspec.Struct, frozen=True):
    admitted: list[Admit]
    waiting: list[Waiting]
    preemptions: list[Preemption] = []
