"""Admission's handlers: intake commands in, job decisions out.

Each handler is idempotent.  Acceptance publishes ``JobAccepted`` with
``Nats-Expected-Last-Subject-Sequence: 0`` on the job's own subject, so a job is
accepted at most once whatever happens to the intake message; decisions about
an existing job carry the job's last subject sequence, so a decision made on a
stale view is refused by the server instead of applied twice.  The handler
returns those decisions; the bus publishes them before it acknowledges the
command, and asks :meth:`IntakeHandler.refused` what a refused one means.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

import msgspec
from nats.js.api import PubAck

from trainyard.bus import Delivery, Outcome, PoisonMessage, PublishRequest, RetryLater, Subscription
from trainyard.bus.subscription import each
from trainyard.core.admission import never_fits
from trainyard.core.admission.commands import (
    cancel_owner_problem,
    cancel_problem,
    job_id_of,
    size_problem,
    subject_tenant,
    submit_errors,
)
from trainyard.core.admission.fit import FleetSummary
from trainyard.domain.job import ValidationError
from trainyard.domain.limits import job_id_problem
from trainyard.events import CancelJob, JobAccepted, JobCancelled, JobRejected, SubmitJob, decode_intake, subjects
from trainyard.observability.logs import kv
from trainyard.observability.metrics import AdmissionMetrics
from trainyard.store.projections import Projections
from trainyard.store.views import TERMINAL
from trainyard_admission.tenancy import TenancyHolder

log = logging.getLogger(__name__)


class Unreadable(msgspec.Struct, frozen=True):
    """An intake payload that is not a valid command."""

    error: str  # why it does not decode
    job_id: str | None  # the usable job id it names, to file a rejection under
    id_problem: str | None  # why it names none


IntakeMessage = SubmitJob | CancelJob | Unreadable


def _rejection_of(tenant: str, bad: Unreadable, clock: Callable[[], float]) -> PublishRequest:
    """A payload that is not a valid command still gets a specific answer
    when it names a job id we can file the rejection under."""
    if bad.job_id is None:
        raise PoisonMessage(f"not a valid intake command and {bad.id_problem}: {bad.error}")
    try:
        subject = subjects.job(tenant, bad.job_id, "admission")
        fence = subjects.job_id_anywhere(bad.job_id)
    except ValueError as err:
        raise PoisonMessage(str(err)) from None
    rejection = JobRejected(
        at=clock(), job_id=bad.job_id, tenant=tenant, errors=[ValidationError("payload", bad.error[:1000])]
    )
    return PublishRequest(
        subject, rejection, f"{tenant}/{bad.job_id}:accepted", expected_last_subject_seq=0, fence_subject=fence
    )


def _tenant_of(subject: str) -> str:
    """The tenant of the intake subject; a malformed subject cannot be answered."""
    tenant, problem = subject_tenant(subject)
    if problem is not None:
        raise PoisonMessage(problem)
    return tenant


class IntakeHandler(Subscription[IntakeMessage]):
    """SubmitJob -> JobAccepted | JobRejected;  CancelJob -> JobCancelled."""

    def __init__(
        self,
        projections: Projections,
        clock: Callable[[], float],
        tenancy: TenancyHolder | None = None,
        metrics: AdmissionMetrics | None = None,
    ) -> None:
        self.metrics = metrics
        self.projections = projections
        self.clock = clock
        self.tenancy = tenancy or TenancyHolder()

    def decode(self, subject: str, data: bytes) -> IntakeMessage:
        problem = size_problem(len(data))
        if problem is not None:
            raise PoisonMessage(problem)
        try:
            return decode_intake(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as err:
            job_id, id_problem = job_id_of(data)
            return Unreadable(str(err), job_id, id_problem)

    async def handle(self, batch: Sequence[Delivery[IntakeMessage]]) -> list[Outcome]:
        read: list[FleetSummary] = []

        async def fleet() -> FleetSummary:  # read once per batch, by the first submission that needs it
            if not read:
                read.append(await self.projections.fleet())
            return read[0]

        return await each(batch, lambda delivery: self._decide(delivery, fleet))

    async def _decide(self, delivery: Delivery[IntakeMessage], fleet: Callable[[], Awaitable[FleetSummary]]) -> Outcome:
        tenant = _tenant_of(delivery.subject)
        cmd = delivery.event
        if isinstance(cmd, Unreadable):
            return Outcome.done(_rejection_of(tenant, cmd, self.clock))
        if isinstance(cmd, SubmitJob):
            return Outcome.done(await self._decide_submit(delivery, tenant, cmd, fleet))
        cancel = await self._decide_cancel(tenant, cmd)
        return Outcome.done() if cancel is None else Outcome.done(cancel)

    async def _decide_submit(
        self,
        delivery: Delivery[IntakeMessage],
        tenant: str,
        cmd: SubmitJob,
        fleet: Callable[[], Awaitable[FleetSummary]],
    ) -> PublishRequest:
        if cmd.job_id is not None and (problem := job_id_problem(cmd.job_id)) is not None:
            raise PoisonMessage(f"job_id: {problem}")  # nothing can be filed under an id that breaks the id rule
        job_id = cmd.job_id or f"j{delivery.seq}"
        try:
            subject = subjects.job(tenant, job_id, "admission")
        except ValueError as err:
            raise PoisonMessage(f"job_id {job_id!r}: {err}") from err
        errors = submit_errors(cmd.spec, cmd.job_id, delivery.subject, tenant, self.tenancy.compiled)
        if not errors and never_fits(cmd.spec, await fleet()):
            # Refuse only on a fleet view that holds every node registered so far.
            errors = never_fits(cmd.spec, await self.projections.caught_up_fleet())
        if errors:
            event: JobAccepted | JobRejected = JobRejected(at=self.clock(), job_id=job_id, tenant=tenant, errors=errors)
        else:
            event = JobAccepted(at=self.clock(), job_id=job_id, spec=cmd.spec, submitted_at=cmd.at)
        # Fenced on the job id under every tenant: one id names one job.
        fence = subjects.job_id_anywhere(job_id)
        return PublishRequest(
            subject, event, f"{tenant}/{job_id}:accepted", expected_last_subject_seq=0, fence_subject=fence
        )

    async def _decide_cancel(self, tenant: str, cmd: CancelJob) -> PublishRequest | None:
        problem = cancel_problem(tenant, cmd.job_id, cmd.tenant, cmd.reason)
        if problem is not None:
            raise PoisonMessage(problem)
        job = await self.projections.job(cmd.job_id)
        if job is None:
            raise RetryLater(f"job {cmd.job_id} is not known yet", delay_s=1.0)
        problem = cancel_owner_problem(tenant, cmd.job_id, job.tenant)
        if problem is not None:
            raise PoisonMessage(problem)
        if job.status in TERMINAL:
            return None
        event = JobCancelled(
            at=self.clock(), job_id=job.job_id, tenant=job.tenant, run_id=job.run_id, reason=cmd.reason
        )
        return PublishRequest(
            subjects.job(job.tenant, job.job_id, "admission"),
            event,
            f"{job.job_id}:cancel",
            expected_last_subject_seq=job.last_seq,
        )

    async def refused(self, delivery: Delivery[IntakeMessage], request: PublishRequest) -> Outcome:
        """Accept: the job id has history, a retry of this tenant's own submit
        (settled) unless another tenant owns it.  Cancel: the job moved on;
        look again on redelivery."""
        decision = request.message
        if isinstance(decision, JobCancelled):
            return Outcome.retry("job changed while cancelling", 0.2)
        return await self._id_taken(decision)

    async def _id_taken(self, event: JobAccepted | JobRejected) -> Outcome:
        """An acceptance refused because the job id has history: a retry of
        this tenant's own submit (settled), or an id another tenant owns
        (dead-lettered, since no event of this tenant can be filed under it)."""
        tenant = event.spec.tenant if isinstance(event, JobAccepted) else event.tenant
        owner = await self.projections.job(event.job_id)
        if owner is None:
            return Outcome.retry(f"job {event.job_id} is not projected yet", delay_s=0.5)
        if owner.tenant != tenant:
            return Outcome.poison(f"job id {event.job_id!r} is already in use; submit with another job id")
        return Outcome.done()

    def published(self, delivery: Delivery[IntakeMessage], request: PublishRequest, ack: PubAck) -> None:
        if not ack.duplicate:
            self._decided(request.message)

    def _decided(self, event: JobAccepted | JobRejected | JobCancelled) -> None:
        """Log one published decision, and count it."""
        if isinstance(event, JobAccepted):
            decision = "accepted"
            log.info(
                "job accepted",
                extra=kv(
                    decision=decision,
                    job_id=event.job_id,
                    tenant=event.spec.tenant,
                    queue=event.spec.queue,
                    gpus=event.spec.total_gpus,
                ),
            )
        elif isinstance(event, JobRejected):
            decision = "rejected"
            problems = "; ".join(f"{e.field}: {e.message}" for e in event.errors)
            log.info(
                "job rejected",
                extra=kv(decision=decision, job_id=event.job_id, tenant=event.tenant, reason=problems[:500]),
            )
        else:
            decision = "cancelled"
            log.info(
                "job cancelled",
                extra=kv(
                    decision=decision,
                    job_id=event.job_id,
                    run_id=event.run_id,
                    tenant=event.tenant,
                    reason=event.reason,
                ),
            )
        if self.metrics is not None:
            self.metrics.decided(decision)
