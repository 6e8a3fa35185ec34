"""The job lifecycle: one fold of the JOBS stream, used by everything that reads it.

:func:`apply` folds one job event into a job's :class:`JobRecord`.  The Redis
projection (``store/lua/apply_job_event.lua``) applies the same rules to the
job hash, field for field, and a property test holds the two equal; the
invariant checker, the simulator and metering take their rules from here.

The rules:

1. A job is created by ``JobAccepted`` (status ``pending``) or ``JobRejected``
   (``rejected``); a second one of either changes nothing.  Events about a
   job that does not exist change nothing.
2. ``JobAdmitted`` moves a pending job to ``admitted`` under a new current
   run id.  Every run-level event after that is *fenced*: it is applied only
   when it names the current run and the job is active (admitted, placed or
   running), so a late or duplicated message about an old run changes nothing.
3. ``JobPlaced`` (admitted -> placed) takes the run's GPUs; ``RunStarted``
   (placed -> running); ``RunSucceeded`` ends the job; both terminal events
   give back what the run held.
4. ``RunFailed`` requeues or fails the job by :func:`failure_category`:
   ``head`` (node failure, lost): pending again, its order moved ahead of every
   job that never ran (by :data:`HEAD_OF_QUEUE_OFFSET`, once); ``keep``
   (preempted): pending, keeping its place; ``timeout`` (a gang placement
   could not place): pending after a growing backoff; ``own`` (the job's own
   failure): retried after a growing backoff up to ``max_retries``, then
   ``failed``.
5. ``JobCancelled`` ends any job that has not ended, whatever run it names.
6. ``PreemptionNotice`` and ``CheckpointSaved`` are recorded for the current
   active run.
7. Every event about an existing job moves its ``last_seq`` (the subject's
   last sequence), applied or not.

:class:`GpuHolders` tracks which run holds each GPU across jobs and records a
violation when a GPU is given to a second run; :class:`JobTable` puts both
together: the whole JOBS projection in memory.
"""

from __future__ import annotations

from typing import NamedTuple

import msgspec

from trainyard.domain.job import JobSpec, ValidationError
from trainyard.events.jobs import (
    CheckpointSaved,
    JobAccepted,
    JobAdmitted,
    JobCancelled,
    JobEvent,
    JobPlaced,
    JobRejected,
    PreemptionNotice,
    ReplicaPlacement,
    RunFailed,
    RunStarted,
    RunSucceeded,
    failure_category,
)

#: A job requeued after a node failure has this subtracted from its order
#: (once: an order already below zero stays), which puts it ahead of every job
#: that never ran, whose order is its accept sequence.  The Lua fold gets the
#: same number from ``job_event_args``.
HEAD_OF_QUEUE_OFFSET = 10**12

PENDING, ADMITTED, PLACED, RUNNING = "pending", "admitted", "placed", "running"
SUCCEEDED, FAILED, CANCELLED, REJECTED = "succeeded", "failed", "cancelled", "rejected"
ACTIVE = frozenset({ADMITTED, PLACED, RUNNING})  # a run holds quota (and, once placed, GPUs)
TERMINAL = frozenset({SUCCEEDED, FAILED, CANCELLED, REJECTED})  # nothing changes it any more

_spec = msgspec.json.Decoder(JobSpec)
_encode = msgspec.json.Encoder().encode

_RUN_EVENTS = (JobPlaced, RunStarted, RunSucceeded, RunFailed, PreemptionNotice, CheckpointSaved)


class JobRecord(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One job as the projection keeps it (the Redis hash ``job:<id>``, one
    field per field here but the id, which is in the key): the read model of
    a job for every reader, decoded from the hash by
    :func:`trainyard.store.job_hash.decode_job`."""

    job_id: str
    status: str  # pending | admitted | placed | running | succeeded | failed | cancelled | rejected
    tenant: str
    order: int  # queue position key: the accept sequence, moved ahead on a node failure
    last_seq: int  # stream sequence of the last event on the job's subject
    queue: str | None = None  # None for a rejected job
    name: str | None = None
    priority_class: str | None = None
    spec: msgspec.Raw | None = None  # the spec as JSON, as the JobAccepted event carried it (see job_spec)
    errors: list[ValidationError] | None = None  # why a rejected job was rejected
    gpus: int = 0  # GPUs of the whole gang
    gpus_by_type: dict[str, int] = {}  # the same GPUs by GPU type (held while active)
    max_retries: int = 0  # failures of its own the job may retry
    run_id: str | None = None  # the current (or last) run
    attempt: int = 0  # of the current run
    requeues: int = 0  # requeues that were not the job's fault (node failure, preemption)
    failures: int = 0  # failures of its own
    timeouts: int = 0  # placement timeouts
    not_before: float | None = None  # waiting out a backoff until then
    cluster: str | None = None
    placement: tuple[ReplicaPlacement, ...] = ()  # the current run's GPUs; () when it holds none
    submitted_at: float | None = None
    accepted_at: float | None = None
    admitted_at: float | None = None
    placed_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    last_checkpoint_at: float | None = None
    last_checkpoint_step: int | None = None
    notice_at: float | None = None  # preemption notice for the current run
    preempt_deadline: float | None = None
    preemptor: str | None = None
    preempt_reason: str | None = None
    reason: str | None = None  # why the last run failed, or why the job was cancelled
    message: str | None = None  # the last failure's message
    attained_gpu_s: float = 0.0  # GPU-seconds its failed or preempted runs held while running (least attained service)

    @property
    def active(self) -> bool:
        return self.status in ACTIVE

    @property
    def job_spec(self) -> JobSpec | None:
        """The spec, decoded (each time: a reader that keeps it caches it)."""
        return None if self.spec is None else _spec.decode(self.spec)


class Folded(NamedTuple):
    """What :func:`apply` returns: the job's record (None while it does not
    exist) and whether the event was applied (False: it changed at most
    ``last_seq``)."""

    record: JobRecord | None
    applied: bool


def backoff(n: int, base_cap: tuple[float, float]) -> float:
    """Seconds to wait after the n-th failure of a kind: base * 2**(n-1), at most cap."""
    base, cap = base_cap
    factor: float = 2 ** (n - 1)  # int ** int is typed Any: it is a float for negative powers
    return min(base * factor, cap)


def apply(record: JobRecord | None, event: JobEvent, seq: int) -> Folded:
    """Fold one event with stream sequence ``seq`` into the job's record."""
    if record is None:
        return Folded(_create(event, seq), isinstance(event, JobAccepted | JobRejected))
    if seq <= record.last_seq:
        return Folded(record, False)  # already folded
    record = msgspec.structs.replace(record, last_seq=seq)
    if isinstance(event, JobAdmitted):
        if record.status != PENDING:
            return Folded(record, False)
        return Folded(_admit(record, event), True)
    if isinstance(event, _RUN_EVENTS):
        if not record.active or event.run_id != record.run_id:
            return Folded(record, False)  # fenced: not the current active run
        if isinstance(event, JobPlaced):
            if record.status != ADMITTED:
                return Folded(record, False)
            return Folded(_place(record, event), True)
        if isinstance(event, RunStarted):
            if record.status != PLACED:
                return Folded(record, False)
            return Folded(msgspec.structs.replace(record, status=RUNNING, started_at=event.at), True)
        if isinstance(event, RunSucceeded):
            return Folded(msgspec.structs.replace(record, status=SUCCEEDED, finished_at=event.at), True)
        if isinstance(event, RunFailed):
            return Folded(_fail(record, event), True)
        if isinstance(event, PreemptionNotice):
            return Folded(_notice(record, event), True)
        return Folded(
            msgspec.structs.replace(record, last_checkpoint_at=event.at, last_checkpoint_step=event.step), True
        )
    if isinstance(event, JobCancelled):
        if record.status in TERMINAL:
            return Folded(record, False)
        return Folded(
            msgspec.structs.replace(record, status=CANCELLED, finished_at=event.at, reason=event.reason), True
        )
    return Folded(record, False)  # a second JobAccepted or JobRejected


def _create(event: JobEvent, seq: int) -> JobRecord | None:
    if isinstance(event, JobAccepted):
        spec = event.spec
        return JobRecord(
            job_id=event.job_id,
            status=PENDING,
            tenant=spec.tenant,
            order=seq,
            last_seq=seq,
            queue=spec.queue,
            name=spec.name,
            priority_class=spec.priority_class,
            spec=msgspec.Raw(_encode(spec)),
            gpus=spec.total_gpus,
            gpus_by_type=spec.gpus_by_type,
            max_retries=spec.max_retries,
            submitted_at=event.submitted_at,
            accepted_at=event.at,
        )
    if isinstance(event, JobRejected):
        return JobRecord(
            job_id=event.job_id,
            status=REJECTED,
            tenant=event.tenant,
            order=seq,
            last_seq=seq,
            errors=list(event.errors),
            finished_at=event.at,
        )
    return None


def _admit(record: JobRecord, event: JobAdmitted) -> JobRecord:
    return msgspec.structs.replace(
        record,
        status=ADMITTED,
        run_id=event.run_id,
        attempt=event.attempt,
        admitted_at=event.at,
        placement=(),
        reason=None,
        started_at=None,
        placed_at=None,
        not_before=None,
    )


def _place(record: JobRecord, event: JobPlaced) -> JobRecord:
    return msgspec.structs.replace(
        record, status=PLACED, placement=tuple(event.replicas), cluster=event.cluster, placed_at=event.at
    )


def _notice(record: JobRecord, event: PreemptionNotice) -> JobRecord:
    return msgspec.structs.replace(
        record,
        notice_at=event.at,
        preempt_deadline=event.at + event.grace_period_s,
        preemptor=event.preemptor,
        preempt_reason=event.reason,
    )


def _fail(record: JobRecord, event: RunFailed) -> JobRecord:
    attained = record.attained_gpu_s
    if record.started_at is not None and event.at > record.started_at:
        attained += (event.at - record.started_at) * record.gpus
    ended = msgspec.structs.replace(
        record,
        reason=event.reason,
        message=event.message,
        placement=(),
        notice_at=None,
        preempt_deadline=None,
        preemptor=None,
        preempt_reason=None,
        attained_gpu_s=attained,
    )
    category, base_cap = failure_category(event.reason)
    replace = msgspec.structs.replace
    if category == "head":
        order = record.order - HEAD_OF_QUEUE_OFFSET if record.order >= 0 else record.order
        return replace(ended, status=PENDING, order=order, requeues=record.requeues + 1)
    if category == "keep":
        return replace(ended, status=PENDING, requeues=record.requeues + 1)
    if category == "timeout":
        n = record.timeouts + 1
        return replace(ended, status=PENDING, timeouts=n, not_before=event.at + backoff(n, base_cap))
    n = record.failures + 1
    if n <= record.max_retries:
        return replace(ended, status=PENDING, failures=n, not_before=event.at + backoff(n, base_cap))
    return replace(ended, status=FAILED, failures=n, finished_at=event.at)


class GpuHolders:
    """Which run holds each GPU, across every job: ``(node, gpu) -> run id``.

    A GPU given to a run while another run holds it is a violation of "no GPU
    is allocated twice"; it is recorded (as the Redis projection records it
    in its ``violations`` list) and the newer run becomes the holder.
    """

    def __init__(self) -> None:
        self.by_gpu: dict[tuple[str, int], str] = {}  # (node, gpu) -> run id holding it
        self.violations: list[str] = []  # in the Redis projection's wording

    def take(self, run_id: str, replicas: tuple[ReplicaPlacement, ...] | list[ReplicaPlacement], seq: int) -> None:
        for r in replicas:
            for g in r.gpus:
                holder = self.by_gpu.get((r.node_id, g))
                if holder is not None and holder != run_id:
                    self.violations.append(f"seq {seq}: GPU {r.node_id}/{g} given to {run_id} while held by {holder}")
                self.by_gpu[(r.node_id, g)] = run_id

    def release(self, run_id: str, replicas: tuple[ReplicaPlacement, ...] | list[ReplicaPlacement]) -> None:
        """Give back the GPUs of ``replicas`` that ``run_id`` still holds."""
        for r in replicas:
            for g in r.gpus:
                if self.by_gpu.get((r.node_id, g)) == run_id:
                    del self.by_gpu[(r.node_id, g)]


class JobTable:
    """Every job's record and the GPU holders, folded from the JOBS stream in
    order: the Redis job projection, in memory.  Sequences at or below the
    last one applied are skipped, as the projection skips them."""

    def __init__(self) -> None:
        self.jobs: dict[str, JobRecord] = {}  # job id -> record
        self.holders = GpuHolders()
        self.last_seq = 0  # last stream sequence folded

    def apply(self, event: JobEvent, seq: int) -> bool:
        """Fold one event; True when it was applied (see :func:`apply`)."""
        if seq <= self.last_seq:
            return False
        self.last_seq = seq
        before = self.jobs.get(event.job_id)
        after, applied = apply(before, event, seq)
        if after is None:
            return applied
        self.jobs[event.job_id] = after
        if applied:
            if before is not None and before.active and not after.active and before.run_id is not None:
                self.holders.release(before.run_id, before.placement)
            if isinstance(event, JobPlaced):
                self.holders.take(event.run_id, after.placement, seq)
        return applied
