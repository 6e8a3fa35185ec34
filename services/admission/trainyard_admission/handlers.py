"""Admission's handlers: intake commands in, job decisions out.

Each handler is idempotent.  Acceptance publishes ``JobAccepted`` with
``Nats-Expected-Last-Subject-Sequence: 0`` on the job's own subject, so a job is
accepted at most once whatever happens to the intake message; decisions about
an existing job carry the job's last subject sequence, so a decision made on a
stale view is refused by the server instead of applied twice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import msgspec
from nats.aio.msg import Msg

from trainyard.bus import Bus, PoisonMessage, PublishRequest, RetryLater, WrongLastSequence
from trainyard.core.admission import never_fits
from trainyard.core.admission.commands import (
    cancel_owner_problem,
    cancel_problem,
    job_id_of,
    size_problem,
    subject_tenant,
    submit_errors,
)
from trainyard.domain.job import ValidationError
from trainyard.domain.limits import job_id_problem
from trainyard.events import (
    CancelJob,
    JobAccepted,
    JobCancelled,
    JobRejected,
    SubmitJob,
    decode_intake,
    subjects,
)
from trainyard.observability.logs import kv
from trainyard.observability.metrics import AdmissionMetrics
from trainyard.store import Store, views
from trainyard.store.fleet import FleetCache
from trainyard.store.views import TERMINAL
from trainyard_admission.tenancy import TenancyHolder

log = logging.getLogger(__name__)


def _rejection_from_bad_payload(msg: Msg, err: Exception, clock: Callable[[], float]) -> PublishRequest:
    """A payload that is not a valid command still gets a specific answer
    when it names a job id we can file the rejection under."""
    tenant = _tenant_of(msg)
    job_id, problem = job_id_of(msg.data)
    if job_id is None:
        raise PoisonMessage(f"not a valid intake command and {problem}: {err}")
    try:
        subject = subjects.job(tenant, job_id, "admission")
        fence = subjects.job_id_anywhere(job_id)
    except ValueError as bad:
        raise PoisonMessage(str(bad)) from err
    rejection = JobRejected(at=clock(), job_id=job_id, tenant=tenant, errors=[ValidationError("payload", str(err)[:1000])])
    return PublishRequest(subject, rejection, f"{tenant}/{job_id}:accepted", expected_last_subject_seq=0, fence_subject=fence)


def _tenant_of(msg: Msg) -> str:
    """The tenant of the intake subject; a malformed subject cannot be answered."""
    tenant, problem = subject_tenant(msg.subject)
    if problem is not None:
        raise PoisonMessage(problem)
    return tenant


class IntakeHandler:
    """SubmitJob -> JobAccepted | JobRejected;  CancelJob -> JobCancelled."""

    def __init__(
        self, bus: Bus, store: Store, clock: Callable[[], float], tenancy: TenancyHolder | None = None,
        metrics: AdmissionMetrics | None = None,
    ) -> None:
        self.metrics = metrics
        self.bus = bus
        self.store = store
        self.clock = clock
        self.tenancy = tenancy or TenancyHolder()
        self.fleet = FleetCache(bus, store)

    async def _decide_submit(self, msg: Msg, cmd: SubmitJob) -> PublishRequest:
        tenant = _tenant_of(msg)
        if cmd.job_id is not None and (problem := job_id_problem(cmd.job_id)) is not None:
            raise PoisonMessage(f"job_id: {problem}")  # nothing can be filed under an id that breaks the id rule
        job_id = cmd.job_id or f"j{msg.metadata.sequence.stream}"
        try:
            subject = subjects.job(tenant, job_id, "admission")
        except ValueError as err:
            raise PoisonMessage(f"job_id {job_id!r}: {err}") from err
        errors = submit_errors(cmd.spec, cmd.job_id, msg.subject, tenant, self.tenancy.compiled)
        if not errors and never_fits(cmd.spec, await self.fleet.summary()):
            # Refuse only on a fleet view that holds every node registered so far.
            errors = never_fits(cmd.spec, await self.fleet.caught_up_summary())
        if errors:
            event: JobAccepted | JobRejected = JobRejected(at=self.clock(), job_id=job_id, tenant=tenant, errors=errors)
        else:
            event = JobAccepted(at=self.clock(), job_id=job_id, spec=cmd.spec, submitted_at=cmd.at)
        # Fenced on the job id under every tenant: one id names one job.
        fence = subjects.job_id_anywhere(job_id)
        return PublishRequest(subject, event, f"{tenant}/{job_id}:accepted", expected_last_subject_seq=0, fence_subject=fence)

    async def _decide_cancel(self, msg: Msg, cmd: CancelJob) -> PublishRequest | None:
        tenant = _tenant_of(msg)
        problem = cancel_problem(tenant, cmd.job_id, cmd.tenant, cmd.reason)
        if problem is not None:
            raise PoisonMessage(problem)
        job = await views.get_job(self.store, cmd.job_id)
        if job is None:
            raise RetryLater(f"job {cmd.job_id} is not known yet", delay_s=1.0)
        problem = cancel_owner_problem(tenant, cmd.job_id, job.tenant)
        if problem is not None:
            raise PoisonMessage(problem)
        if job.status in TERMINAL:
            return None
        event = JobCancelled(at=self.clock(), job_id=job.job_id, tenant=job.tenant, run_id=job.run_id, reason=cmd.reason)
        return PublishRequest(
            subjects.job(job.tenant, job.job_id, "admission"), event, f"{job.job_id}:cancel",
            expected_last_subject_seq=job.last_seq,
        )

    async def _id_taken(self, event: JobAccepted | JobRejected) -> BaseException | None:
        """An acceptance refused because the job id has history: a retry of
        this tenant's own submit (settled), or an id another tenant owns
        (dead-lettered, since no event of this tenant can be filed under it)."""
        tenant = event.spec.tenant if isinstance(event, JobAccepted) else event.tenant
        owner = await views.get_job(self.store, event.job_id)
        if owner is None:
            return RetryLater(f"job {event.job_id} is not projected yet", delay_s=0.5)
        if owner.tenant != tenant:
            return PoisonMessage(f"job id {event.job_id!r} is already in use; submit with another job id")
        return None

    async def __call__(self, msgs: Sequence[Msg]) -> list[BaseException | None]:
        outcomes: list[BaseException | None] = [None] * len(msgs)
        requests: list[tuple[int, PublishRequest]] = []
        for i, msg in enumerate(msgs):
            try:
                problem = size_problem(len(msg.data))
                if problem is not None:
                    raise PoisonMessage(problem)
                try:
                    cmd = decode_intake(msg.data)
                except (msgspec.DecodeError, msgspec.ValidationError) as err:
                    requests.append((i, _rejection_from_bad_payload(msg, err, self.clock)))
                    continue
                if isinstance(cmd, SubmitJob):
                    requests.append((i, await self._decide_submit(msg, cmd)))
                else:
                    req = await self._decide_cancel(msg, cmd)
                    if req is not None:
                        requests.append((i, req))
            except Exception as err:  # noqa: BLE001 - settled by the consumer loop
                outcomes[i] = err
        results = await self.bus.publish_many([r for _, r in requests])
        for (i, req), result in zip(requests, results, strict=True):
            if isinstance(result, WrongLastSequence):
                # Accept: the job id exists, a retry unless another tenant owns
                # it.  Cancel: the job moved on; look again on redelivery.
                if isinstance(req.message, JobCancelled):
                    outcomes[i] = RetryLater("job changed while cancelling", 0.2)
                else:
                    outcomes[i] = await self._id_taken(req.message)
            elif isinstance(result, Exception):
                outcomes[i] = result
            elif not result.duplicate:
                self._decided(req.message)
        return outcomes

    def _decided(self, event: JobAccepted | JobRejected | JobCancelled) -> None:
        """Log one published decision, and count it."""
        if isinstance(event, JobAccepted):
            decision = "accepted"
            log.info("job accepted", extra=kv(decision=decision, job_id=event.job_id, tenant=event.spec.tenant,
                                               queue=event.spec.queue, gpus=event.spec.total_gpus))
        elif isinstance(event, JobRejected):
            decision = "rejected"
            problems = "; ".join(f"{e.field}: {e.message}" for e in event.errors)
            log.info("job rejected", extra=kv(decision=decision, job_id=event.job_id, tenant=event.tenant,
                                               reason=problems[:500]))
        else:
            decision = "cancelled"
            log.info("job cancelled", extra=kv(decision=decision, job_id=event.job_id, run_id=event.run_id,
                                                tenant=event.tenant, reason=event.reason))
        if self.metrics is not None:
            self.metrics.decided(decision)
