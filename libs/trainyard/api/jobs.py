"""Submit, read, list and cancel jobs: the operations behind REST and gRPC.

Submitting publishes ``SubmitJob`` on the tenant's intake subject; admission
turns it into ``JobAccepted`` or ``JobRejected``.  The job id is the
idempotency key: a retried submission with the same id is one job.
"""

from __future__ import annotations

import re
import time
import uuid

from trainyard.bus import Bus
from trainyard.domain.job import JobSpec, ValidationError, validate_job_spec
from trainyard.events import CancelJob, SubmitJob, subjects
from trainyard.store import Store
from trainyard.store import views
from trainyard.store.views import TERMINAL, JobView

JOB_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class InvalidRequest(Exception):
    def __init__(self, errors: list[ValidationError]) -> None:
        super().__init__("; ".join(str(e) for e in errors))
        self.errors = errors


class NotFound(Exception):
    pass


class Conflict(Exception):
    pass


def new_job_id() -> str:
    return "j-" + uuid.uuid4().hex[:20]


def check_job_id(job_id: str) -> list[ValidationError]:
    if not JOB_ID_RE.match(job_id):
        return [ValidationError("job_id", "use 1-64 letters, digits, '_' or '-'")]
    return []


class JobOperations:
    def __init__(self, bus: Bus, store: Store, clock=time.time) -> None:
        self.bus = bus
        self.store = store
        self.clock = clock

    async def submit(self, spec: JobSpec, job_id: str | None = None) -> str:
        job_id = job_id or new_job_id()
        errors = check_job_id(job_id) + validate_job_spec(spec)
        if errors:
            raise InvalidRequest(errors)
        command = SubmitJob(at=self.clock(), spec=spec, job_id=job_id)
        await self.bus.publish(subjects.intake(spec.tenant), command, msg_id=f"submit:{job_id}")
        return job_id

    async def get(self, job_id: str, tenant: str | None = None) -> JobView:
        job = await views.get_job(self.store, job_id) if JOB_ID_RE.match(job_id) else None
        if job is None or (tenant is not None and job.tenant != tenant):
            raise NotFound(job_id)
        return job

    async def list(self, tenant: str | None = None, status: str | None = None, limit: int = 100) -> list[JobView]:
        return await views.list_jobs(self.store, tenant=tenant, status=status, limit=limit)

    async def cancel(self, job_id: str, tenant: str | None = None, reason: str = "cancelled by user") -> JobView:
        job = await self.get(job_id, tenant)
        if job.status in TERMINAL:
            raise Conflict(f"job {job_id} is already {job.status}")
        command = CancelJob(at=self.clock(), job_id=job_id, tenant=job.tenant, reason=reason)
        await self.bus.publish(subjects.intake(job.tenant), command, msg_id=f"cancel:{job_id}")
        return job
