"""One admission cycle: read the projection, call the pure core, publish.

Besides admitting, a cycle gives preemption notices, stops victims whose grace
period is over (``RunFailed(preempted)``: requeued keeping their place), stops
runs at their run-time limit (``RunFailed(timeout)``: the job's own failure,
retried after a backoff), gives back the quota of gangs placement could not
place in time (``RunFailed(placement_timeout)``: requeued after a backoff), and
reads the fair-share standing folded from the JOBS stream
(:mod:`trainyard.store.fairshare`: each ``JobAdmitted`` names the queue and
the GPUs the run holds, so the log alone says who used what, and when).
Every decision about a job is fenced by the job's last subject sequence.

The core gets what it decides on: each pending job's run-time limit,
submission time and the GPU-seconds its earlier runs held (backfill, aging,
least attained service), each running job's expected end (backfill), and,
when preemption may be needed, the cluster as placement sees it (nodes, free
GPUs, the runs holding them) with the pending jobs' specs, so victims are
chosen where the waiting gang can use their GPUs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from itertools import pairwise

import msgspec

from trainyard.bus import Bus, PublishRequest, WrongLastSequence
from trainyard.core.admission import (
    AdmissionPolicy,
    AdmissionResult,
    AdmissionSnapshot,
    PendingJob,
    RunningJob,
    Waiting,
    admit,
)
from trainyard.core.admission.deadlines import HeldRun, overdue
from trainyard.core.lifecycle import JobRecord
from trainyard.core.placement import ClusterSnapshot
from trainyard.domain.job import JobSpec
from trainyard.domain.node import NodeInfo
from trainyard.events import JobAdmitted, PreemptionNotice, RunFailed, subjects
from trainyard.observability.logs import kv
from trainyard.observability.metrics import AdmissionMetrics
from trainyard.store import Projector, Store, views, waiting
from trainyard.store.fairshare import FairShareLog, FairShareStandings
from trainyard_admission.backlog import Backlog
from trainyard_admission.tenancy import TenancyHolder

log = logging.getLogger(__name__)

_node_info = msgspec.json.Decoder(NodeInfo)


def run_id_for(job_id: str, attempt: int) -> str:
    return f"{job_id}-r{attempt}"


def queue_depth(pending: list[PendingJob]) -> dict[tuple[str, str], tuple[int, int]]:
    """Pending (jobs, GPUs) per (tenant, queue)."""
    depth: dict[tuple[str, str], tuple[int, int]] = {}
    for job in pending:
        jobs, gpus = depth.get((job.tenant, job.queue), (0, 0))
        depth[(job.tenant, job.queue)] = (jobs + 1, gpus + sum(job.gpus_by_type.values()))
    return depth


class AdmissionCycle:
    def __init__(
        self,
        bus: Bus,
        store: Store,
        projector: Projector,
        policy: AdmissionPolicy,
        clock: Callable[[], float],
        window: int = 20_000,
        node_projector: tuple[Projector, ...] = (),
        tenancy: TenancyHolder | None = None,
        placement_timeout_s: float = 60.0,
        cluster: str | None = None,
        metrics: AdmissionMetrics | None = None,
        preempt_kill_margin_s: float = 0.0,
    ) -> None:
        self.bus = bus
        self.store = store
        self.projector = projector
        self.projections = [projector, *node_projector]  # caught up before every snapshot
        self.policy = policy
        self.clock = clock
        self.tenancy = tenancy or TenancyHolder()
        self.placement_timeout_s = placement_timeout_s
        # a victim on executing nodes is failed here this long after its grace (the dispatcher's fallback)
        self.preempt_kill_margin_s = preempt_kill_margin_s
        # the pending and active jobs, kept between cycles and re-read where they changed
        self.backlog = Backlog(store, projector, self.tenancy, window)
        # the cluster for topology-aware preemption; None: victims by GPU counts
        self.cluster = views.ClusterReader(store, cluster) if cluster is not None else None
        self.last_timings: dict[str, float] = {}  # seconds per step of the last cycle
        self._reasons: dict[str, Waiting] = {}  # why each job waits, as last written (to write changes)
        self._changed: set[str] = set()  # jobs with events since their reason was written
        self.metrics = metrics  # None: not exported (tests that do not look)
        self._active: list[str] = []  # the active jobs of the last snapshot
        self.fair_share_log = FairShareLog(bus, store)
        self.standings = FairShareStandings(store)

    async def snapshot(self) -> tuple[AdmissionSnapshot, dict[str, JobRecord]]:
        """The core's snapshot, and the records of the jobs in it (pending and active)."""
        pending_ids, active_ids = await self._read_backlog()
        pending = self.backlog.pending_jobs(pending_ids)
        running = self.backlog.running_jobs(active_ids)
        self._active = active_ids
        capacity = await views.gpus_by_type(self.store, "capacity")
        in_use = await views.gpus_by_type(self.store, "inuse")
        history, recent = await self._fair_share_state()
        cluster, specs = await self._cluster(pending, running, active_ids)
        snapshot = AdmissionSnapshot(pending, capacity, in_use, running, history, recent, cluster, specs)
        return snapshot, self.backlog.records

    async def _read_backlog(self) -> tuple[list[str], list[str]]:
        pending_ids, active_ids = await self.backlog.read()
        if self.backlog.reset:
            self._reasons.clear()  # Redis may have lost them too: write them all again
        self._changed |= self.backlog.touched  # their records changed: write their reasons again
        return pending_ids, active_ids

    async def warm(self) -> None:
        """Read the pending and active jobs without deciding: what a standby does
        while another process leads, so that its first cycle as leader re-reads
        only the jobs that changed since, as every later cycle does.

        A standby writes no reasons and forgets those it wrote when it last led:
        the leader has written since, so its first cycle writes them all."""
        for projector in self.projections:
            await projector.caught_up()
        pending_ids, _ = await self._read_backlog()
        self.backlog.pending_jobs(pending_ids)
        self._reasons.clear()
        self._changed.clear()  # every reason is written on taking over

    async def _cluster(
        self, pending: list[PendingJob], running: list[RunningJob], active_ids: list[str]
    ) -> tuple[ClusterSnapshot | None, dict[str, JobSpec]]:
        """Where the GPUs are, and the pending jobs' specs, when a pending job might preempt."""
        tenancy = self.tenancy.compiled
        if self.cluster is None or tenancy is None or not pending or not any(r.preemptible for r in running):
            return None, {}
        p = tenancy.preemption
        if not (p.within_queue or p.reclaim or p.fair_share):
            return None, {}
        cluster, _ = await self.cluster.read(active_ids)
        return cluster, {j.job_id: self.backlog.spec(j.job_id) for j in pending}

    async def _fair_share_state(self) -> tuple[dict[str, dict[str, float]], list[float]]:
        """The decayed usage now and the recent fair-share preemptions, folded
        from the JOBS stream through its head (admission is the only writer)."""
        compiled = self.tenancy.compiled
        half_life = compiled.half_life_s if compiled else 7 * 24 * 3600.0
        window = compiled.preemption.fair_share_window_s if compiled else 600.0
        await self.fair_share_log.catch_up(half_life)
        standings = await self.standings.read(self.clock(), window)
        return standings.usage, standings.preemptions

    async def run_once(self) -> int:
        """One cycle; returns how many decisions it published."""
        clock = time.perf_counter
        t = [clock()]
        # 1. Snapshot the projection, once it holds everything the log holds.
        for projector in self.projections:
            await projector.caught_up()
        snapshot, rows = await self.snapshot()
        now = self.clock()
        t.append(clock())
        # 2. Decide (pure).
        policy = AdmissionPolicy(
            self.policy.max_admissions_per_cycle, self.tenancy.compiled, self.policy.max_preemptors_per_cycle
        )
        result = admit(snapshot, policy, now) if snapshot.pending else AdmissionResult([], [])
        t.append(clock())
        # 3. Publish the decisions, each fenced by the job's last subject sequence.
        demand = {p.job_id: p for p in snapshot.pending}
        requests = (
            self._admissions(result, rows, demand, now)
            + self._notices(result, rows, now)
            + await self._stops(rows, now)
        )
        results = await self.bus.publish_many(requests)
        for req, r in zip(requests, results, strict=True):
            if isinstance(r, Exception):
                if not isinstance(r, WrongLastSequence):
                    log.warning("admission publish failed: %r", r)
            elif not r.duplicate:
                self._decided(req, rows, now)
        t.append(clock())
        # 4. Say why everyone else waits (only what changed since the last cycle), and
        #    forget the reasons of jobs no longer waiting here.
        reasons = {w.job_id: w for w in result.waiting}
        last, touched = self._reasons, self._changed
        changed = {
            j: waiting.Waiting(w.reason.value, w.position)
            for j, w in reasons.items()
            if j in touched or last.get(j) != w
        }
        await waiting.write(self.store, "pending", changed, gone=last.keys() - reasons.keys())
        self._reasons, self._changed = reasons, set()
        t.append(clock())
        # 5. Read our own writes before the next cycle.
        seqs = [r.seq for r in results if not isinstance(r, Exception)]
        if seqs:
            await self.projector.wait_for(max(seqs))
        t.append(clock())
        self.last_timings = dict(
            zip(("snapshot", "decide", "publish", "reasons", "read_back"), (b - a for a, b in pairwise(t)), strict=True)
        )
        if self.metrics is not None:
            self.metrics.cycle_done(t[-1] - t[0])
            admitted = {d.job_id for d in result.admitted}
            self.metrics.set_queues(queue_depth([p for p in snapshot.pending if p.job_id not in admitted]))
        return len(seqs)

    def _decided(self, req: PublishRequest, rows: dict[str, JobRecord], now: float) -> None:
        """Log one published decision, and count it."""
        event = req.message
        r = rows.get(event.job_id)
        queue = (r.queue if r is not None else None) or ""
        if isinstance(event, JobAdmitted):
            decision = "admitted"
            log.info(
                "job admitted",
                extra=kv(
                    decision=decision,
                    job_id=event.job_id,
                    run_id=event.run_id,
                    tenant=event.tenant,
                    queue=queue,
                    attempt=event.attempt,
                ),
            )
            submitted = r.submitted_at if r is not None else None
            if self.metrics is not None and event.attempt == 1 and submitted is not None:
                self.metrics.waited([now - submitted])
        elif isinstance(event, PreemptionNotice):
            decision = "preempted"
            log.info(
                "run to be preempted",
                extra=kv(
                    decision=decision,
                    job_id=event.job_id,
                    run_id=event.run_id,
                    tenant=event.tenant,
                    queue=queue,
                    preemptor=event.preemptor,
                    reason=event.reason,
                    grace_period_s=event.grace_period_s,
                ),
            )
        else:
            decision = "stopped"
            log.info(
                "run stopped",
                extra=kv(
                    decision=f"stopped:{event.reason}",
                    job_id=event.job_id,
                    run_id=event.run_id,
                    tenant=event.tenant,
                    queue=queue,
                    reason=event.message,
                ),
            )
        if self.metrics is not None:
            self.metrics.decided(decision)

    def _admissions(
        self, result: AdmissionResult, rows: dict[str, JobRecord], demand: dict[str, PendingJob], now: float
    ) -> list[PublishRequest]:
        out = []
        for decision in result.admitted:
            r, job = rows[decision.job_id], demand[decision.job_id]
            attempt = r.attempt + 1
            event = JobAdmitted(
                at=now,
                job_id=decision.job_id,
                tenant=r.tenant,
                run_id=run_id_for(decision.job_id, attempt),
                attempt=attempt,
                resume_from_step=r.last_checkpoint_step,
                queue=job.queue,
                gpus_by_type=job.gpus_by_type,
            )
            subject = subjects.job(r.tenant, decision.job_id, "admission")
            out.append(PublishRequest(subject, event, f"{decision.job_id}:admit:{attempt}", r.last_seq))
        return out

    def _notices(self, result: AdmissionResult, rows: dict[str, JobRecord], now: float) -> list[PublishRequest]:
        out = []
        for p in result.preemptions:
            r = rows.get(p.job_id)
            if r is None or not r.run_id or r.notice_at is not None:
                continue
            event = PreemptionNotice(
                at=now,
                job_id=p.job_id,
                tenant=r.tenant,
                run_id=r.run_id,
                preemptor=p.preemptor,
                reason=p.reason.value,
                grace_period_s=p.grace_period_s,
                lost_gpu_seconds=p.lost_gpu_seconds,
            )
            subject = subjects.job(r.tenant, p.job_id, "admission")
            out.append(PublishRequest(subject, event, f"{r.run_id}:notice", r.last_seq))
        return out

    async def _executing(self, job_ids: list[str]) -> set[str]:
        """Those of ``job_ids`` whose current run is placed on nodes whose agents execute it."""
        placements = await views.run_placements(self.store, job_ids)
        node_ids = sorted({r.node_id for _, replicas in placements.values() for r in replicas})
        infos = await self.store.redis.hmget(self.store.key("nodeinfo"), node_ids) if node_ids else []
        executing = {n for n, raw in zip(node_ids, infos, strict=True) if raw and _node_info.decode(raw).executes}
        return {j for j, (_, replicas) in placements.items() if any(r.node_id in executing for r in replicas)}

    async def _stops(self, rows: dict[str, JobRecord], now: float) -> list[PublishRequest]:
        """Victims past their grace period (and margin), and gangs placement did not place in time."""
        noticed = [j for j in self._active if rows[j].preempt_deadline is not None and now >= rows[j].preempt_deadline]
        margin = self.preempt_kill_margin_s
        executing = await self._executing(noticed) if noticed and margin > 0 else set()
        held = [
            HeldRun(
                job_id,
                r.status,
                r.admitted_at,
                r.preempt_deadline,
                r.started_at,
                self.backlog.limit(job_id),
                margin if job_id in executing else 0.0,
            )
            for job_id in self._active
            if (r := rows[job_id]).run_id
        ]
        out = []
        for stop in overdue(held, now, self.placement_timeout_s):
            r = rows[stop.job_id]
            if stop.reason == "preempted":
                message = f"preempted for {r.preemptor or 'a waiting job'}"
            elif stop.reason == "timeout":
                message = f"stopped at its run-time limit of {self.backlog.spec(stop.job_id).max_runtime_s}s"
            else:
                message = f"not placed within {self.placement_timeout_s:.0f}s"
            event = RunFailed(
                at=now, job_id=stop.job_id, tenant=r.tenant, run_id=r.run_id or "", reason=stop.reason, message=message
            )
            subject = subjects.job(r.tenant, stop.job_id, "admission")
            out.append(PublishRequest(subject, event, f"{r.run_id}:failed", r.last_seq))
        return out
