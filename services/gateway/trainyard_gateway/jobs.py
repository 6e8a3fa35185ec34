"""Submit, read, list and cancel jobs: the operations behind REST and gRPC.

Submitting publishes ``SubmitJob`` on the tenant's intake subject; admission
turns it into ``JobAccepted`` or ``JobRejected``.  The job id is the
idempotency key: a retried submission with the same id is one job.  A job id
another tenant's job already has is refused (:class:`JobIdTaken`).  Every
submission and cancellation is also an audit record under the verified actor.
The command and its audit record are published together (one wait for both
acknowledgements, not two in a row); the call succeeds only when both are
stored, and a retry with the same job id stores neither twice.  The audit
trail records requests, as before: a submission admission later rejects, or
one whose command failed while its audit record was stored (the caller was
told it failed), still has its record.

Every read of the JOBS projection goes through
:class:`~trainyard.store.caught_up.CaughtUpReads`: while the projection is
rebuilt (Redis wiped or restarted empty) a read raises
``ProjectionRebuilding`` (503, gRPC UNAVAILABLE) instead of answering 404 or
an older state of a job that exists.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid

from trainyard.auth.principal import check_name
from trainyard.bus import Bus
from trainyard.bus.audit import audit
from trainyard.core.lifecycle import JobRecord
from trainyard.domain.job import JobSpec, ValidationError, validate_job_spec
from trainyard.events import CancelJob, SubmitJob, subjects
from trainyard.ledger.archive import JobArchive
from trainyard.store import Store, job_hash, job_pages, views, waiting
from trainyard.store.caught_up import CaughtUpReads
from trainyard.store.job_pages import JobQuery, Position
from trainyard.store.views import TERMINAL
from trainyard_gateway.archived_lists import with_archived
from trainyard_gateway.schema import JobView

JOB_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")  # always fullmatch: "$" would let a final newline through
#: A job spec is small; this stays far below the 1 MiB NATS payload limit (REST body, gRPC message).
MAX_SUBMIT_BYTES = 256 * 1024
MAX_LIST_LIMIT = 1000
MAX_REASON_CHARS = 256
#: What a list shows of each job: all but its spec.
LISTED = tuple(f for f in job_hash.FIELDS if f != "spec")


class InvalidRequest(Exception):
    def __init__(self, errors: list[ValidationError]) -> None:
        super().__init__("; ".join(str(e) for e in errors))
        self.errors = errors


class BadCursor(InvalidRequest):
    """A ``cursor`` that is not one the gateway gave out for this list and
    these filters (:mod:`trainyard_gateway.pages`): 400, gRPC INVALID_ARGUMENT."""


class NotFound(Exception):
    pass


class Conflict(Exception):
    pass


class JobIdTaken(Conflict):
    """The job id belongs to another tenant's job."""


def new_job_id() -> str:
    return "j-" + uuid.uuid4().hex[:20]


def check_job_id(job_id: str, field: str = "job_id") -> list[ValidationError]:
    if not isinstance(job_id, str) or not JOB_ID_RE.fullmatch(job_id):
        return [ValidationError(field, f"{job_id!r} is not a job id: use 1-64 letters, digits, '_' or '-'")]
    return []


def check_tenant_name(tenant: str | None, field: str = "tenant") -> list[ValidationError]:
    """A tenant named in a request must be usable as a subject token."""
    problem = None if tenant is None else check_name("tenant", tenant)
    return [ValidationError(field, problem)] if problem else []


def require_valid(*problems: list[ValidationError]) -> None:
    errors = [e for group in problems for e in group]
    if errors:
        raise InvalidRequest(errors)


class JobOperations:
    def __init__(self, bus: Bus, store: Store, clock=time.time, archive: JobArchive | None = None) -> None:
        self.bus = bus
        self.store = store
        self.clock = clock
        self.archive = archive  # finished jobs past their retention, which the projection no longer holds
        self.caught_up = CaughtUpReads(bus, store)
        self.nodes_caught_up = CaughtUpReads(bus, store, streams=("NODES",))  # the node list, by REST

    async def _send(
        self,
        tenant: str,
        job_id: str,
        command: SubmitJob | CancelJob,
        msg_id: str,
        actor: str,
        action: str,
        reason: str = "",
        details: dict[str, str] | None = None,
    ) -> None:
        """Publish a command on its tenant's intake subject and its audit record
        (under ``audit:<msg_id>``) concurrently; raise the first failure once
        both have finished, so neither is left running."""
        outcomes = await asyncio.gather(
            self.bus.publish(subjects.intake(tenant), command, msg_id=msg_id),
            audit(
                self.bus,
                actor,
                action,
                job_id,
                reason,
                details={"tenant": tenant, **(details or {})},
                at=command.at,
                record_id=f"audit:{msg_id}",
            ),
            return_exceptions=True,
        )
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    async def submit(self, spec: JobSpec, job_id: str | None = None, *, actor: str) -> str:
        job_id = job_id or new_job_id()
        require_valid(check_job_id(job_id), check_tenant_name(spec.tenant), validate_job_spec(spec))
        owner = await self.caught_up.read(lambda: views.job_tenant(self.store, job_id))
        if owner is None and (archived := await self._archived(job_id)) is not None:
            owner = archived.tenant
        if owner is not None and owner != spec.tenant:
            raise JobIdTaken(f"job id {job_id!r} is already taken; choose another job_id (or leave it out)")
        now = self.clock()
        command = SubmitJob(at=now, spec=spec, job_id=job_id)
        key = f"{spec.tenant}:{job_id}"
        await self._send(
            spec.tenant, job_id, command, f"submit:{key}", actor, "job.submit", details={"queue": spec.queue}
        )
        return job_id

    async def _archived(self, job_id: str) -> JobRecord | None:
        return None if self.archive is None else await asyncio.to_thread(self.archive.get, job_id)

    async def _job(self, job_id: str) -> JobRecord | None:
        """The job as the projection holds it, or as the archive does once it
        has left the projection (finished, past its retention)."""
        job = await views.get_job(self.store, job_id)
        return job if job is not None else await self._archived(job_id)

    async def record(self, job_id: str, tenant: str | None) -> JobRecord:
        require_valid(check_job_id(job_id))
        job = await self.caught_up.read(lambda: self._job(job_id))
        if job is None or (tenant is not None and job.tenant != tenant):
            raise NotFound(job_id)
        return job

    async def get(self, job_id: str, tenant: str | None = None) -> JobView:
        """The job; :class:`NotFound` when there is none, or it belongs to a
        tenant other than ``tenant`` (when given)."""
        require_valid(check_job_id(job_id))

        async def read() -> JobView | None:
            job = await self._job(job_id)
            if job is None or (tenant is not None and job.tenant != tenant):
                return None
            return JobView.of(job, (await waiting.read(self.store, [job])).get(job_id))

        view = await self.caught_up.read(read)  # None only from a caught-up projection
        if view is None:
            raise NotFound(job_id)
        return view

    async def list(self, tenant: str | None = None, status: str | None = None, limit: int = 100) -> list[JobView]:
        """The first ``limit`` jobs, newest first, without their specs."""
        jobs, _ = await self.page(JobQuery(tenant=tenant, status=status), limit)
        return jobs

    async def page(
        self, query: JobQuery, limit: int = 100, after: Position | None = None, archived: bool = False
    ) -> tuple[list[JobView], Position | None]:
        """A page of jobs without their specs, and where the next page starts
        after (None: the list has ended); see :mod:`trainyard.store.job_pages`.
        ``archived``: with the jobs of the job archive, in the same order
        (:mod:`trainyard_gateway.archived_lists`)."""

        async def read() -> tuple[list[JobView], Position | None]:
            page = await job_pages.page_jobs(self.store, query, limit, after, LISTED)
            if archived and self.archive is not None:
                page = await with_archived(self.store, self.archive, query, limit, after, page)
            why = await waiting.read(self.store, page.jobs)
            return [JobView.of(j, why.get(j.job_id), with_spec=False) for j in page.jobs], page.next

        return await self.caught_up.read(read)

    async def cancel(
        self, job_id: str, tenant: str | None = None, reason: str = "cancelled by user", *, actor: str
    ) -> JobRecord:
        job = await self.record(job_id, tenant)
        if job.status in TERMINAL:
            raise Conflict(f"job {job_id} is already {job.status}")
        now = self.clock()
        command = CancelJob(at=now, job_id=job_id, tenant=job.tenant, reason=reason)
        await self._send(job.tenant, job_id, command, f"cancel:{job_id}", actor, "job.cancel", reason=reason)
        return job
