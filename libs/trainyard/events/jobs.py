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

FailureReason = Literal["node_failure", "workload_error", "timeout", "preempted", "lost"]

#: Failure reasons that are not the job's fault: the job is requeued at the
#: head of its queue and the attempt does not count against its retries.
INFRASTRUCTURE_FAILURES: frozenset[str] = frozenset({"node_failure", "lost", "preempted"})


class _Message(msgspec.Struct, tag_field="type", kw_only=True, frozen=True):
    at: float  # when the producer decided this, seconds since the Unix epoch


# --- commands on the intake stream (what a submission portal may publish) ---


class SubmitJob(_Message, tag="SubmitJob"):
    """Ask to run a job.  ``job_id`` is also the idempotency key: submitting
    the same id twice creates one job.  Without one, admission derives the id
    from the intake stream sequence."""

    spec: JobSpec
    job_id: str | None = None


class CancelJob(_Message, tag="CancelJob"):
    job_id: str
    tenant: str
    reason: str = "cancelled by user"


IntakeCommand = SubmitJob | CancelJob


# --- events on the jobs stream, subject trainyard.jobs.<tenant>.<job_id> ---


class JobAccepted(_Message, tag="JobAccepted"):
    job_id: str
    spec: JobSpec
    submitted_at: float


class JobRejected(_Message, tag="JobRejected"):
    job_id: str
    tenant: str
    errors: list[ValidationError]


class JobAdmitted(_Message, tag="JobAdmitted"):
    job_id: str
    tenant: str
    run_id: str
    attempt: int


class ReplicaPlacement(msgspec.Struct, frozen=True):
    """Where one replica runs.  ``rank`` orders the whole gang so that
    consecutive ranks share an NVLink domain or leaf switch."""

    role: str
    replica: int
    rank: int
    node_id: str
    gpus: list[int]


class JobPlaced(_Message, tag="JobPlaced"):
    job_id: str
    tenant: str
    run_id: str
    cluster: str
    replicas: list[ReplicaPlacement]


class RunStarted(_Message, tag="RunStarted"):
    job_id: str
    tenant: str
    run_id: str


class RunSucceeded(_Message, tag="RunSucceeded"):
    job_id: str
    tenant: str
    run_id: str


class RunFailed(_Message, tag="RunFailed"):
    job_id: str
    tenant: str
    run_id: str
    reason: FailureReason
    message: str = ""
    node_id: str | None = None


class JobCancelled(_Message, tag="JobCancelled"):
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
)
