"""Job and run lifecycle messages.

A *job* is what a researcher submitted; a *run* is one attempt at it.  A job
that is preempted or whose node fails runs again under a new run id, and every
message about a run carries that id so that late or duplicated messages about
an old attempt change nothing.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from trainyard.domain.job import JobSpec, ValidationError
from trainyard.events import subjects

FailureReason = Literal["node_failure", "workload_error", "timeout", "preempted", "lost", "placement_timeout"]

#: Failure reasons that are not the job's fault: the job is requeued and the
#: attempt does not count against its retries.  A node failure puts it at the
#: head of its queue; a preempted job or a gang placement could not find room
#: for keeps its place (the latter after a backoff).
INFRASTRUCTURE_FAILURES: frozenset[str] = frozenset({"node_failure", "lost", "preempted", "placement_timeout"})
HEAD_OF_QUEUE_FAILURES: frozenset[str] = frozenset({"node_failure", "lost"})

#: Backoff before a job is considered again: after its n-th placement timeout,
#: and after its n-th failure of its own (it is then retried up to max_retries).
PLACEMENT_BACKOFF_S = (5.0, 300.0)  # base, cap: min(base * 2**(n-1), cap)
RETRY_BACKOFF_S = (10.0, 600.0)


def failure_category(reason: str) -> tuple[str, tuple[float, float]]:
    """How the fold requeues a job whose run failed for ``reason``, and its backoff."""
    if reason in HEAD_OF_QUEUE_FAILURES:
        return "head", (0.0, 0.0)
    if reason == "placement_timeout":
        return "timeout", PLACEMENT_BACKOFF_S
    if reason in INFRASTRUCTURE_FAILURES:
        return "keep", (0.0, 0.0)
    return "own", RETRY_BACKOFF_S


class _Message(msgspec.Struct, tag_field="type", kw_only=True, frozen=True):
    at: float  # when the producer decided this, seconds since the Unix epoch


# --- commands on the intake stream (what a submission portal may publish) ---


class SubmitJob(_Message, tag="SubmitJob", frozen=True):
    """Ask to run a job.  ``job_id`` is also the idempotency key: submitting
    the same id twice creates one job.  Without one, admission derives the id
    from the intake stream sequence."""

    spec: JobSpec
    job_id: str | None = None


class CancelJob(_Message, tag="CancelJob", frozen=True):
    job_id: str
    tenant: str
    reason: str = "cancelled by user"


IntakeCommand = SubmitJob | CancelJob


# --- events on the jobs stream, subject trainyard.jobs.<tenant>.<job_id>.<writer> ---


class JobAccepted(_Message, tag="JobAccepted", frozen=True):
    job_id: str
    spec: JobSpec
    submitted_at: float


class JobRejected(_Message, tag="JobRejected", frozen=True):
    job_id: str
    tenant: str
    errors: list[ValidationError]


class JobAdmitted(_Message, tag="JobAdmitted", frozen=True):
    job_id: str
    tenant: str
    run_id: str
    attempt: int
    # The run restarts from this checkpoint of an earlier run, if there is one.
    resume_from_step: int | None = None
    # The job's queue and its gang's GPUs by type: what the run holds, so fair
    # share is folded from the log alone ("" and {}: written before these were).
    queue: str = ""
    gpus_by_type: dict[str, int] = {}


class ReplicaPlacement(msgspec.Struct, frozen=True):
    """Where one replica runs.  ``rank`` orders the whole gang so that
    consecutive ranks share an NVLink domain or leaf switch."""

    role: str
    replica: int
    rank: int
    node_id: str
    gpus: list[int]


class JobPlaced(_Message, tag="JobPlaced", frozen=True):
    job_id: str
    tenant: str
    run_id: str
    cluster: str
    replicas: list[ReplicaPlacement]


class RunStarted(_Message, tag="RunStarted", frozen=True):
    job_id: str
    tenant: str
    run_id: str


class RunSucceeded(_Message, tag="RunSucceeded", frozen=True):
    job_id: str
    tenant: str
    run_id: str


class RunFailed(_Message, tag="RunFailed", frozen=True):
    job_id: str
    tenant: str
    run_id: str
    reason: FailureReason
    message: str = ""
    node_id: str | None = None


class PreemptionNotice(_Message, tag="PreemptionNotice", frozen=True):
    """Stop within ``grace_period_s`` (checkpoint first); the run is then
    stopped with ``RunFailed(reason="preempted")`` and the job requeued,
    keeping its place."""

    job_id: str
    tenant: str
    run_id: str
    preemptor: str  # the job the room is for
    reason: str  # priority, reclaim or fair_share
    grace_period_s: float
    lost_gpu_seconds: float = 0.0  # GPU time since the last checkpoint, were it stopped now


class CheckpointSaved(_Message, tag="CheckpointSaved", frozen=True):
    """The run wrote a checkpoint; a later run of the job resumes from it."""

    job_id: str
    tenant: str
    run_id: str
    step: int


class JobCancelled(_Message, tag="JobCancelled", frozen=True):
    job_id: str
    tenant: str
    run_id: str | None = None
    reason: str = "cancelled by user"


JobEvent = (
    JobAccepted
    | JobRejected
    | JobAdmitted
    | JobPlaced
    | RunStarted
    | RunSucceeded
    | RunFailed
    | JobCancelled
    | PreemptionNotice
    | CheckpointSaved
)


#: Which writers (the last token of a job subject) may publish each event.
#: The bus's permissions give each credential its own token; the projection
#: folds no event whose subject names a writer not allowed to send it.
WRITERS: dict[str, frozenset[str]] = {
    "JobAccepted": frozenset({"admission"}),
    "JobRejected": frozenset({"admission"}),
    "JobAdmitted": frozenset({"admission"}),
    "PreemptionNotice": frozenset({"admission"}),
    "JobCancelled": frozenset({"admission"}),
    "JobPlaced": frozenset({"placement"}),
    # The emulator ("agent") reports its own runs; the run dispatcher in the
    # placement service reports runs that node agents execute, from their reports.
    "RunStarted": frozenset({"agent", "placement"}),
    "RunSucceeded": frozenset({"agent", "placement"}),
    "CheckpointSaved": frozenset({"agent", "placement"}),
    # The emulator or the run dispatcher reports a run's failure, health fails
    # runs on lost nodes, admission stops runs past their time limit.
    "RunFailed": frozenset({"agent", "placement", "health", "admission"}),
}


def writer_of(event: JobEvent) -> str:
    """The usual writer of ``event`` (a run's events: the emulator's "agent")."""
    writers = WRITERS[type(event).__name__]
    return "agent" if "agent" in writers else next(iter(writers))


def subject_disagrees(subject: str, event: object) -> str | None:
    """Why a JOBS event may not be folded under ``subject`` (None: it may).

    The subject's tenant and job id must be the body's, and its writer one
    allowed to send that event: a credential that may publish only its own
    writer token cannot pass off another service's decision."""
    parts = subject.split(".")
    if len(parts) != 5 or parts[1] != "jobs":
        return f"{subject} is not a job subject (trainyard.jobs.<tenant>.<job_id>.<writer>)"
    _, _, tenant, job_id, writer = parts
    kind = type(event).__name__
    body_tenant = event.spec.tenant if isinstance(event, JobAccepted) else getattr(event, "tenant", None)
    if getattr(event, "job_id", None) != job_id or body_tenant != tenant:
        return f"{kind} for {body_tenant}/{getattr(event, 'job_id', None)} was sent on {subject}"
    if writer not in WRITERS.get(kind, ()):
        return f"{kind} may not be written by {writer!r} (only {', '.join(sorted(WRITERS.get(kind, ())))})"
    return None


def job_subject(event: JobEvent, writer: str | None = None) -> str:
    """The subject ``event`` is published on (by its usual writer unless named)."""
    tenant = event.spec.tenant if isinstance(event, JobAccepted) else event.tenant
    return subjects.job(tenant, event.job_id, writer or writer_of(event))
