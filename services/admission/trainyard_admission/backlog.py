"""The pending and active jobs as admission last read them, kept between cycles.

A cycle re-reads from Redis only what changed since the last one: the jobs
the JOBS projector saw events for (``Projector.drain_touched``), and any job
it has not read yet.  The records of every other job, and the ``PendingJob``
built from each for the core, are kept.  While every pending job fits the
cycle's window the set of pending jobs is kept too: last cycle's set, less
the jobs that changed and are no longer pending, plus those that changed and
are.  It is checked against the size of the projection's pending index every
cycle (one ``ZCARD``), and read whole again when they differ.

Everything is read again from scratch when the projector found Redis had lost
the projection (a wipe, a failover) or skipped events another process applied
(their ids never reach ``drain_touched``).  The first read, and every such
read, reads the jobs in chunks of one script call each (:func:`views.get_jobs`),
and decodes a job's spec only when something needs it (the run-time limit is
read from the spec's JSON alone).
"""

from __future__ import annotations

import msgspec

from trainyard.core.admission import PendingJob, RunningJob
from trainyard.core.lifecycle import PENDING, JobRecord
from trainyard.domain.job import JobSpec
from trainyard.store import Projector, Store, views
from trainyard_admission.tenancy import TenancyHolder

#: What a cycle reads of every pending and active job (besides the head).
READS = (
    "queue",
    "gpus_by_type",
    "spec",
    "run_id",
    "attempt",
    "not_before",
    "priority_class",
    "last_checkpoint_step",
    "last_checkpoint_at",
    "admitted_at",
    "notice_at",
    "preempt_deadline",
    "preemptor",
    "submitted_at",
    "started_at",
    "attained_gpu_s",
)

_DEFAULT_RUNTIME_S = next(f.default for f in msgspec.structs.fields(JobSpec) if f.name == "max_runtime_s")


class _Limit(msgspec.Struct):
    """The one field of a spec every cycle needs (the rest is skipped unread)."""

    max_runtime_s: int = _DEFAULT_RUNTIME_S


_limit = msgspec.json.Decoder(_Limit).decode


class Backlog:
    def __init__(self, store: Store, projector: Projector, tenancy: TenancyHolder, window: int) -> None:
        self.store = store
        self.projector = projector
        self.tenancy = tenancy
        self.window = window  # how many of the oldest pending jobs one cycle considers
        self.records: dict[str, JobRecord] = {}  # job id -> its record (READS), while pending or active
        self._jobs: dict[str, PendingJob] = {}  # pending job id -> what the core is handed, built once per record
        self._limits: dict[str, float] = {}  # job id -> its run-time limit, while pending or active
        self._specs: dict[str, JobSpec] = {}  # job id -> spec, decoded when first needed (specs never change)
        self._pending: set[str] | None = None  # every pending job, as of the last read; None: read the index
        self._seen = (-1, -1)  # the projector's (lost_count, unseen_count) at the last read
        self._tenancy: object = None  # the tenancy the PendingJobs were built under
        self.touched: set[str] = set()  # jobs read again by the last read (their records changed)
        self.reset = False  # whether the last read started over

    def limit(self, job_id: str) -> float:
        return self._limits[job_id]

    def spec(self, job_id: str) -> JobSpec:
        """The job's spec, decoded once."""
        spec = self._specs.get(job_id)
        if spec is None:
            spec = self._specs[job_id] = self.records[job_id].job_spec or JobSpec("", "", [])
        return spec

    def _start_over(self) -> None:
        self.records.clear()
        self._jobs.clear()
        self._limits.clear()
        self._specs.clear()
        self._pending = None
        self.reset = True

    async def _read(self, job_ids: list[str]) -> list[JobRecord]:
        records = await views.get_jobs(self.store, job_ids, READS)
        for r in records:
            self.records[r.job_id] = r
            if r.spec is not None:
                self._limits[r.job_id] = float(_limit(r.spec).max_runtime_s)
        return records

    def _forget(self, job_id: str) -> None:
        self.records.pop(job_id, None)
        self._jobs.pop(job_id, None)
        self._limits.pop(job_id, None)
        self._specs.pop(job_id, None)

    async def read(self) -> tuple[list[str], list[str]]:
        """Bring the kept records up to date; returns the ids of the pending
        jobs this cycle considers (its window) and of the active jobs."""
        self.reset = False
        seen = (self.projector.lost_count, self.projector.unseen_count)
        if seen != self._seen:
            self._seen = seen
            self._start_over()
        touched = self.projector.drain_touched()
        for job_id in touched:
            self.records.pop(job_id, None)
            self._jobs.pop(job_id, None)
        pipe = self.store.redis.pipeline(transaction=False)
        pipe.zcard(self.store.key("pending"))
        pipe.zrange(self.store.key("active"), 0, -1)
        count, active_ids = await pipe.execute()
        pending_ids: list[str] | None = None
        if count > self.window:
            self._pending = None  # a window: which jobs it holds is read every cycle
            pending_ids = await views.pending_window(self.store, self.window)
        elif self._pending is not None:
            # Last cycle's pending jobs, with those that changed read again.
            read = await self._read([j for j in touched if j not in self.records])
            now_pending = {r.job_id for r in read if r.status == PENDING}
            kept = self._pending - touched
            if len(kept) + len(now_pending) == count:
                self._pending = kept | now_pending
                pending_ids = list(self._pending)
        if pending_ids is None:
            pending_ids = await views.ids_in(self.store, "pending", self.window - 1)
            if count <= self.window:
                self._pending = set(pending_ids)
        await self._read([j for j in [*pending_ids, *active_ids] if j not in self.records])
        if self._pending is None or self.reset or len(self.records) > len(pending_ids) + len(active_ids):
            wanted = {*pending_ids, *active_ids}
            for job_id in [j for j in self.records if j not in wanted]:
                self._forget(job_id)  # no longer pending or active, or out of the window
        else:
            for job_id in touched:
                if job_id in self.records and job_id not in self._pending and not self.records[job_id].active:
                    self._forget(job_id)
        self.touched = touched
        pending, active = [], []
        records, limits = self.records, self._limits
        for job_id in dict.fromkeys([*pending_ids, *active_ids]):
            r = records.get(job_id)
            if r is None or job_id not in limits:
                continue  # gone meanwhile, or no spec
            if r.status == PENDING:
                pending.append(job_id)
            elif r.active:
                active.append(job_id)
        return pending, active

    def pending_jobs(self, job_ids: list[str]) -> list[PendingJob]:
        """The core's view of each pending job, built once per record and tenancy revision."""
        if self._tenancy is not self.tenancy.compiled:
            self._tenancy = self.tenancy.compiled
            self._jobs.clear()  # priorities come from the tenancy
        jobs, out = self._jobs, []
        for job_id in job_ids:
            job = jobs.get(job_id)
            if job is None:
                r = self.records[job_id]
                priority, _, only_borrow = self.tenancy.priority_class(r.priority_class)
                job = jobs[job_id] = PendingJob(
                    job_id,
                    r.tenant,
                    r.queue or "",
                    r.order,
                    r.gpus_by_type,
                    priority,
                    r.not_before,
                    only_borrow,
                    runtime_limit_s=self._limits[job_id],
                    attained_gpu_s=r.attained_gpu_s,
                    submitted_at=r.submitted_at,
                )
            out.append(job)
        return out

    def running_jobs(self, job_ids: list[str]) -> list[RunningJob]:
        """The core's view of each active job (few, and changing: built every cycle)."""
        out = []
        for job_id in job_ids:
            r = self.records[job_id]
            priority, preemptible, only_borrow = self.tenancy.priority_class(r.priority_class)
            admitted_at = r.admitted_at or 0.0
            started_at = r.started_at
            out.append(
                RunningJob(
                    job_id,
                    r.tenant,
                    r.queue or "",
                    r.gpus_by_type,
                    admitted_at,
                    r.last_checkpoint_at,
                    priority,
                    preemptible,
                    only_borrow,
                    r.notice_at,
                    expected_end=(started_at if started_at is not None else admitted_at) + self._limits[job_id],
                    attained_gpu_s=r.attained_gpu_s,
                )
            )
        return out
