"""The API's public shapes: every body the gateway's REST routes take or
answer with, named as the OpenAPI document names them.  gRPC answers with
the protobuf messages of ``proto/trainyard/v1``, built from the same
:class:`JobView`; the console renders it.

Only data here: the routes that fill them are in :mod:`trainyard_gateway.rest`
and the ``*_api`` modules.  A new field gets a default, so an older client
reading a newer gateway's answer is never surprised by a missing one.
"""

from __future__ import annotations

import msgspec

from trainyard.bus.deadletters import DeadLetter
from trainyard.core.health import HistoryEntry
from trainyard.core.lifecycle import JobRecord
from trainyard.domain.job import JobSpec
from trainyard.events import ReplicaPlacement
from trainyard.store import waiting
from trainyard.store.views import NodeRecord

# --- jobs ----------------------------------------------------------------------------


class JobView(msgspec.Struct):
    """A job as the API shows it (REST, gRPC, the console): its record, and
    why it waits while it does."""

    job_id: str
    status: str
    tenant: str
    queue: str | None = None
    name: str | None = None
    priority_class: str | None = None
    gpus: int = 0
    order: int = 0
    attempt: int = 0
    requeues: int = 0
    run_id: str | None = None
    last_seq: int = 0
    submitted_at: float | None = None
    accepted_at: float | None = None
    admitted_at: float | None = None
    placed_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    reason: str | None = None  # why it waits; else why its last run failed, or why it was cancelled
    message: str | None = None
    position: int | None = None  # its place in line, while pending
    not_before: float | None = None  # waiting out a backoff until then
    expected_start: float | None = None  # placement's estimate, when a reservation holds room for it
    last_checkpoint_step: int | None = None
    preempt_deadline: float | None = None  # told to stop by then (preemption notice)
    errors: list[dict[str, str]] | None = None
    placement: list[ReplicaPlacement] | None = None
    spec: JobSpec | None = None

    @classmethod
    def of(cls, job: JobRecord, why: waiting.Waiting | None = None, with_spec: bool = True) -> JobView:
        """``job`` as shown, with ``why`` it waits (as the decider of its status said)."""
        return cls(
            job_id=job.job_id,
            status=job.status,
            tenant=job.tenant,
            queue=job.queue,
            name=job.name,
            priority_class=job.priority_class,
            gpus=job.gpus,
            order=job.order,
            attempt=job.attempt,
            requeues=job.requeues,
            run_id=job.run_id or None,
            last_seq=job.last_seq,
            submitted_at=job.submitted_at,
            accepted_at=job.accepted_at,
            admitted_at=job.admitted_at,
            placed_at=job.placed_at,
            started_at=job.started_at,
            finished_at=job.finished_at,
            reason=why.reason if why else job.reason or None,
            message=job.message or None,
            position=why.position if why else None,
            not_before=job.not_before,
            expected_start=why.expected_start if why else None,
            last_checkpoint_step=job.last_checkpoint_step,
            preempt_deadline=job.preempt_deadline,
            errors=None if job.errors is None else [{"field": e.field, "message": e.message} for e in job.errors],
            placement=list(job.placement) or None,
            spec=job.job_spec if with_spec else None,
        )


class SubmitJobBody(JobSpec, frozen=True):
    """A job spec plus an optional ``job_id`` (the idempotency key)."""

    job_id: str | None = None

    def job_spec(self) -> JobSpec:
        return JobSpec(**{name: getattr(self, name) for name in JobSpec.__struct_fields__})


class Submitted(msgspec.Struct):
    job_id: str
    status: str  # "submitted": admission will accept or reject it


class Cancelling(msgspec.Struct):
    job_id: str
    status: str  # "cancelling": the cancel command is published


class JobList(msgspec.Struct):
    jobs: list[JobView]
    next_cursor: str | None = None  # the next page's cursor; None: the list has ended


class NodeList(msgspec.Struct):
    nodes: list[NodeRecord]
    next_cursor: str | None = None  # the next page's cursor; None: the list has ended


class Health(msgspec.Struct):
    status: str  # "ok" or "unavailable"
    checks: dict[str, str]


# --- errors ---------------------------------------------------------------------------


class FieldError(msgspec.Struct):
    field: str
    message: str


class ErrorBody(msgspec.Struct, omit_defaults=True):
    """Every error the gateway returns."""

    code: str  # unauthenticated, permission_denied, invalid_argument, not_found, conflict, ...
    message: str
    errors: list[FieldError] = []  # one per bad field, for invalid_argument


# --- API tokens -----------------------------------------------------------------------


class CreateTokenBody(msgspec.Struct, frozen=True):
    name: str  # 1-64 letters, digits, '_' or '-'
    role: str  # researcher, tenant-admin, operator, finance or admin
    tenant: str | None = None  # required for researcher and tenant-admin, refused for the others
    expires_in_s: float | None = None  # None: until revoked


class TokenInfo(msgspec.Struct):
    id: str
    name: str
    role: str
    tenant: str | None
    created_at: float
    created_by: str
    expires_at: float | None
    revoked: bool
    revoked_at: float | None
    revoked_by: str | None


class CreatedToken(msgspec.Struct):
    token: str  # ty_<id>_<secret>: shown this once, stored only hashed
    info: TokenInfo


class TokenList(msgspec.Struct):
    tokens: list[TokenInfo]
    next_cursor: str | None = None  # the next page's cursor; None: the list has ended


# --- nodes ----------------------------------------------------------------------------


class NodeCommandBody(msgspec.Struct, frozen=True):
    reason: str  # who acted is the verified caller, never a field of the body


class NodeCommandAccepted(msgspec.Struct):
    node_id: str
    command: str
    state: str  # the node's state now
    expected_state: str  # the state health will move it to
    status: str = "accepted"


class NodeHistory(msgspec.Struct):
    node_id: str
    state: str
    reason: str
    since: float
    remedy: str | None
    gpus: list[int]
    cordoned_by: str | None
    lemon: bool
    incidents: list[float]
    history: list[HistoryEntry]


# --- dead letters ---------------------------------------------------------------------


class DeadLetterList(msgspec.Struct):
    deadletters: list[DeadLetter]
    next_cursor: str | None = None  # the next page's cursor; None: the list has ended


class ReplayBody(msgspec.Struct, frozen=True):
    reason: str = ""  # why (recorded in the audit stream); who is the verified caller


class LogChunk(msgspec.Struct, frozen=True, kw_only=True):
    """A chunk of one rank's output (``GET /v1/jobs/{job_id}/logs``)."""

    job_id: str
    attempt: int
    rank: int
    node_id: str
    offset: int  # where ``data`` starts in the rank's log
    next_offset: int  # where the next read starts
    size: int  # the log's size when it was read
    data: str  # the bytes as UTF-8, bad bytes replaced
    finished: bool  # the attempt is over: nothing more will be written
