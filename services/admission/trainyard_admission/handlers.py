"""Admission's handlers: intake commands in, job decisions out.

Each handler is idempotent.  Acceptance publishes ``JobAccepted`` with
``Nats-Expected-Last-Subject-Sequence: 0`` on the job's own subject, so a job is
accepted at most once whatever happens to the intake message; decisions about
an existing job carry the job's last subject sequence, so a decision made on a
stale view is refused by the server instead of applied twice.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence

import msgspec
from nats.aio.msg import Msg

from trainyard.bus import Bus, PoisonMessage, PublishRequest, RetryLater, WrongLastSequence
from trainyard.core.admission import AdmissionPolicy, AdmissionSnapshot, PendingJob, admit
from trainyard.domain.job import JobSpec, ValidationError, validate_job_spec
from trainyard.events import (
    CancelJob,
    JobAccepted,
    JobAdmitted,
    JobCancelled,
    JobRejected,
    SubmitJob,
    decode_intake,
    subjects,
)
from trainyard.store import Projector, Store
from trainyard.store import views
from trainyard.store.views import TERMINAL

log = logging.getLogger(__name__)


def gpu_demand(spec: JobSpec) -> dict[str, int]:
    demand: dict[str, int] = {}
    for role in spec.roles:
        demand[role.gpu_type] = demand.get(role.gpu_type, 0) + role.gpus
    return demand


def run_id_for(job_id: str, attempt: int) -> str:
    return f"{job_id}-r{attempt}"


def _rejection_from_bad_payload(msg: Msg, err: Exception, clock: Callable[[], float]) -> PublishRequest:
    """A payload that is not a valid command still gets a specific answer
    when it names a job id we can file the rejection under."""
    tenant = msg.subject.split(".")[-1]
    try:
        raw = json.loads(msg.data)
        job_id = raw.get("job_id") if isinstance(raw, dict) else None
    except ValueError:
        job_id = None
    if not isinstance(job_id, str) or not job_id:
        raise PoisonMessage(f"not a valid intake command and no job_id to reject it under: {err}")
    try:
        subject = subjects.job(tenant, job_id)
    except ValueError as bad:
        raise PoisonMessage(str(bad)) from err
    rejection = JobRejected(at=clock(), job_id=job_id, tenant=tenant, errors=[ValidationError("payload", str(err))])
    return PublishRequest(subject, rejection, f"{job_id}:accepted", expected_last_subject_seq=0)


class IntakeHandler:
    """SubmitJob -> JobAccepted | JobRejected;  CancelJob -> JobCancelled."""

    def __init__(self, bus: Bus, store: Store, clock: Callable[[], float]) -> None:
        self.bus = bus
        self.store = store
        self.clock = clock

    def _decide_submit(self, msg: Msg, cmd: SubmitJob) -> PublishRequest:
        tenant = msg.subject.split(".")[-1]
        job_id = cmd.job_id or f"j{msg.metadata.sequence.stream}"
        try:
            subject = subjects.job(tenant, job_id)
        except ValueError as err:
            raise PoisonMessage(f"job_id {job_id!r}: {err}") from err
        errors = validate_job_spec(cmd.spec)
        if cmd.spec.tenant != tenant:
            errors.append(
                ValidationError("tenant", f"spec is for tenant {cmd.spec.tenant!r} but was sent to {msg.subject}")
            )
        if errors:
            event: JobAccepted | JobRejected = JobRejected(at=self.clock(), job_id=job_id, tenant=tenant, errors=errors)
        else:
            event = JobAccepted(at=self.clock(), job_id=job_id, spec=cmd.spec, submitted_at=cmd.at)
        return PublishRequest(subject, event, f"{job_id}:accepted", expected_last_subject_seq=0)

    async def _decide_cancel(self, cmd: CancelJob) -> PublishRequest | None:
        job = await views.get_job(self.store, cmd.job_id)
        if job is None:
            raise RetryLater(f"job {cmd.job_id} is not known yet", delay_s=1.0)
        if job.tenant != cmd.tenant:
            raise PoisonMessage(f"job {cmd.job_id} does not belong to tenant {cmd.tenant}")
        if job.status in TERMINAL:
            return None
        event = JobCancelled(at=self.clock(), job_id=job.job_id, tenant=job.tenant, run_id=job.run_id, reason=cmd.reason)
        return PublishRequest(
            subjects.job(job.tenant, job.job_id), event, f"{job.job_id}:cancel", expected_last_subject_seq=job.last_seq
        )

    async def __call__(self, msgs: Sequence[Msg]) -> list[BaseException | None]:
        outcomes: list[BaseException | None] = [None] * len(msgs)
        requests: list[tuple[int, PublishRequest]] = []
        for i, msg in enumerate(msgs):
            try:
                try:
                    cmd = decode_intake(msg.data)
                except (msgspec.DecodeError, msgspec.ValidationError) as err:
                    requests.append((i, _rejection_from_bad_payload(msg, err, self.clock)))
                    continue
                if isinstance(cmd, SubmitJob):
                    requests.append((i, self._decide_submit(msg, cmd)))
                else:
                    req = await self._decide_cancel(cmd)
                    if req is not None:
                        requests.append((i, req))
            except Exception as err:  # noqa: BLE001 - settled by the consumer loop
                outcomes[i] = err
        results = await self.bus.publish_many([r for _, r in requests])
        for (i, req), result in zip(requests, results, strict=True):
            if isinstance(result, WrongLastSequence):
                # Accept: the job already exists, so this is a retry.  Cancel:
                # the job moved on; look again on redelivery.
                is_cancel = isinstance(req.message, JobCancelled)
                outcomes[i] = RetryLater("job changed while cancelling", 0.2) if is_cancel else None
            elif isinstance(result, Exception):
                outcomes[i] = result
        return outcomes


class AdmissionCycle:
    """Reads the projection, calls the pure core, publishes the decisions."""

    def __init__(
        self, bus: Bus, store: Store, projector: Projector, policy: AdmissionPolicy, clock: Callable[[], float],
        window: int = 20_000, node_projector: tuple[Projector, ...] = (),
    ) -> None:  # fmt: skip
        self.bus = bus
        self.store = store
        self.projector = projector
        self.projections = [projector, *node_projector]  # caught up before every snapshot
        self.policy = policy
        self.clock = clock
        self.window = window  # how many of the oldest pending jobs one cycle considers
        self._demand: dict[str, tuple[str, dict[str, int]]] = {}  # job id -> (queue, GPUs by type)

    async def snapshot(self) -> tuple[AdmissionSnapshot, dict[str, views.JobHead]]:
        pending_ids = await views.ids_in(self.store, "pending", self.window - 1)
        heads = {j.job_id: j for j in await views.job_heads(self.store, pending_ids) if j.status == "pending"}
        missing = [j for j in heads if j not in self._demand]
        if missing:
            for job_id, spec in (await views.job_specs(self.store, missing)).items():
                self._demand[job_id] = (spec.queue, gpu_demand(spec))
        for job_id in [j for j in self._demand if j not in heads]:
            del self._demand[job_id]
        pending = [
            PendingJob(j.job_id, j.tenant, self._demand[j.job_id][0], j.order, self._demand[j.job_id][1])
            for j in heads.values()
            if j.job_id in self._demand
        ]
        capacity = await views.gpus_by_type(self.store, "capacity")
        in_use = await views.gpus_by_type(self.store, "inuse")
        return AdmissionSnapshot(pending=pending, capacity=capacity, in_use=in_use), heads

    async def run_once(self) -> int:
        """One cycle; returns how many jobs were admitted."""
        # 1. Snapshot the projection, once it holds everything the log holds.
        for projector in self.projections:
            await projector.caught_up()
        snapshot, jobs = await self.snapshot()
        if not snapshot.pending:
            return 0
        # 2. Decide (pure).
        result = admit(snapshot, self.policy, self.clock())
        # 3. Publish the decisions, each fenced by the job's last subject sequence.
        requests = []
        for decision in result.admitted:
            job = jobs[decision.job_id]
            attempt = job.attempt + 1
            event = JobAdmitted(
                at=self.clock(), job_id=job.job_id, tenant=job.tenant, run_id=run_id_for(job.job_id, attempt), attempt=attempt
            )
            requests.append(
                PublishRequest(
                    subjects.job(job.tenant, job.job_id), event, f"{job.job_id}:admit:{attempt}", job.last_seq
                )
            )
        results = await self.bus.publish_many(requests)
        seqs = [r.seq for r in results if not isinstance(r, Exception)]
        for r in results:
            if isinstance(r, Exception) and not isinstance(r, WrongLastSequence):
                log.warning("admission publish failed: %r", r)
        # 4. Say why everyone else waits.
        await views.set_pending_reasons(
            self.store, {w.job_id: (w.reason.value, w.position) for w in result.waiting}
        )
        # 5. Read our own writes before the next cycle.
        if seqs:
            await self.projector.wait_for(max(seqs))
        return len(seqs)
