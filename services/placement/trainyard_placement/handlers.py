"""Placement's cycle: admitted gangs in, ``JobPlaced`` out.

GPUs are taken by the ``JobPlaced`` event itself: the projection's Lua fold
writes each GPU's holder (fenced by run id) and frees it exactly once when the
run ends.  One leader per cluster decides (a lease in NATS KV), and it reads
its own writes before its next cycle, so no GPU is given twice.

Each ``JobPlaced`` is also fenced by the job subject's last sequence, so a job
is placed at most once per run even if two processes decide.  That fence is
per job, not per GPU: two deciders working from different snapshots can give
the same GPU to two different jobs.  Only the lease prevents that, which is
why the cycle checks it before deciding and again right before publishing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

import msgspec

from trainyard.bus import Bus, PublishRequest, WrongLastSequence
from trainyard.core.lifecycle import JobRecord
from trainyard.core.placement import (
    ClusterSnapshot,
    Placement,
    PlacementPolicy,
    PlacementRequest,
    PlacementResult,
    place,
)
from trainyard.domain.job import JobSpec
from trainyard.events import JobPlaced, subjects
from trainyard.observability.logs import kv
from trainyard.observability.metrics import PlacementMetrics
from trainyard.store import Projector, Store, views, waiting

log = logging.getLogger(__name__)

#: Job statuses whose current run holds GPUs.
HOLDING = views.HOLDING


class Leadership(Protocol):
    """What the cycle needs of a lease: whether it may decide right now."""

    @property
    def held(self) -> bool: ...


class Binding(Protocol):
    """Carries placed runs to where jobs run (``binding.KubeBinding``); None: ``JobPlaced`` is enough."""

    async def reconcile(self, placed: list[tuple[Placement, JobSpec]]) -> None: ...


class PlacementStats(msgspec.Struct):
    """Counters of one process's cycles (logged; read by tests)."""

    cycles: int = 0  # cycles that decided
    placed: int = 0  # JobPlaced events this process published
    backfilled: int = 0  # of those, started ahead of a reserved gang
    conflicts: int = 0  # JobPlaced refused by the expected-last-sequence fence
    dropped: int = 0  # decisions thrown away because the lease was lost before publishing
    reservations: int = 0  # reservations in the last cycle (recomputed every cycle)
    reserved_cycles: int = 0  # cycles that left at least one gang holding a reservation
    placed_jobs: list[str] = []  # job ids this process placed, in order


class Snapshot(msgspec.Struct):
    """One cycle's view: the cluster for the core, the requests, and the jobs' records."""

    cluster: ClusterSnapshot
    requests: list[PlacementRequest]
    waiting: dict[str, JobRecord]  # admitted jobs by id
    placed: list[Placement] = []  # runs placed but not started, with where they go


class PlacementCycle:
    def __init__(
        self,
        bus: Bus,
        store: Store,
        projector: Projector,
        cluster: str,
        clock: Callable[[], float],
        node_projector: tuple[Projector, ...] = (),
        lease: Leadership | None = None,
        policy: PlacementPolicy = PlacementPolicy(),
        binding: Binding | None = None,
        metrics: PlacementMetrics | None = None,
    ) -> None:
        self.metrics = metrics  # None: not exported
        self.bus = bus
        self.store = store
        self.projector = projector
        self.projections = [projector, *node_projector]  # caught up before every snapshot
        self.cluster = cluster
        self.clock = clock
        self.lease = lease  # None: always decide (a test's single decider)
        self.policy = policy
        self.binding = binding
        self.stats = PlacementStats()
        self.reader = views.ClusterReader(store, cluster, policy)  # nodes and runs holding GPUs, from Redis
        self._specs = self.reader.specs  # job id -> spec, for every active job (specs never change)
        self._replicas = self.reader.replicas  # run id -> where it runs, decoded once
        self._outlook: dict[str, waiting.Waiting] = {}  # why each admitted job waits, as last written

    @property
    def leading(self) -> bool:
        return self.lease is None or self.lease.held

    async def snapshot(self) -> Snapshot:
        active = await views.ids_in(self.store, "active")
        cluster, jobs = await self.reader.read(active)
        waiting = {j.job_id: j for j in jobs.values() if j.status == "admitted" and j.job_id in self._specs}
        requests = [
            PlacementRequest(job_id=j.job_id, run_id=j.run_id or "", spec=self._specs[j.job_id], order=j.order)
            for j in waiting.values()
        ]
        placed = [
            Placement(j.job_id, j.run_id, self._replicas[j.run_id])
            for j in jobs.values()
            if j.status == "placed" and j.run_id in self._replicas
        ]
        return Snapshot(cluster, requests, waiting, placed)

    async def run_once(self) -> int:
        # 0. Only the leader decides.
        if not self.leading:
            return 0
        started = time.perf_counter()
        try:
            return await self._cycle()
        finally:
            if self.metrics is not None:
                self.metrics.cycle_done(time.perf_counter() - started)

    async def _cycle(self) -> int:
        # 1. Snapshot the projection, once it holds everything the log holds.
        for projector in self.projections:
            await projector.caught_up()
        snap = await self.snapshot()
        # 1b. Carry earlier placements to where jobs run, when a binder is set.
        if self.binding is not None and snap.placed:
            await self.binding.reconcile([(p, self._specs[p.job_id]) for p in snap.placed])
        if self.metrics is not None:
            self.metrics.waiting.set(len(snap.requests))
            if not snap.requests:
                self.metrics.reservations.set(0)
        if not snap.requests:
            return 0
        # 2. Decide (pure).
        result = place(snap.cluster, snap.requests, self.clock())
        # 3. Publish, each fenced by the job's last subject sequence.
        return await self.publish(snap, result)

    async def publish(self, snap: Snapshot, result: PlacementResult) -> int:
        self.stats.cycles += 1
        self._note_reservations(result)
        # 3a. Record why the others wait, and forget the outlook of jobs no longer waiting here.
        outlook = {u.job_id: waiting.Waiting(u.reason.value, expected_start=u.expected_start) for u in result.unplaced}
        await waiting.write(self.store, "admitted", outlook, gone=self._outlook.keys() - outlook.keys())
        self._outlook = outlook
        requests = []
        for p in result.placements:
            job = snap.waiting[p.job_id]
            event = JobPlaced(
                at=self.clock(),
                job_id=p.job_id,
                tenant=job.tenant,
                run_id=p.run_id,
                cluster=self.cluster,
                replicas=p.replicas,
            )
            subject = subjects.job(job.tenant, job.job_id, "placement")
            requests.append(PublishRequest(subject, event, f"{p.run_id}:placed", job.last_seq))
        # 3b. The lease may have lapsed while we decided, and another process may lead now.
        if requests and not self.leading:
            self.stats.dropped += len(requests)
            if self.metrics is not None:
                self.metrics.decided("dropped", len(requests))
            log.warning("placement: lease lost before publishing; dropping %d placements", len(requests))
            return 0
        results = await self.bus.publish_many(requests) if requests else []
        seqs = []
        for p, r in zip(result.placements, results, strict=True):
            if isinstance(r, WrongLastSequence):
                self.stats.conflicts += 1
                if self.metrics is not None:
                    self.metrics.decided("conflict")
            elif isinstance(r, Exception):
                log.warning("placement publish failed: %r", r)
            elif not r.duplicate:
                seqs.append(r.seq)
                self.stats.placed += 1
                self.stats.backfilled += p.backfilled
                self.stats.placed_jobs.append(p.job_id)
                self._placed(p, snap.waiting[p.job_id])
            else:
                seqs.append(r.seq)
        # 4. Read our own writes before the next cycle.
        if seqs:
            await self.projector.wait_for(max(seqs))
        return len(seqs)

    def _placed(self, p: Placement, job: JobRecord) -> None:
        """Log one published placement, and count it."""
        nodes = sorted({r.node_id for r in p.replicas})
        log.info(
            "run placed",
            extra=kv(
                decision="placed",
                job_id=p.job_id,
                run_id=p.run_id,
                tenant=job.tenant,
                nodes=nodes,
                gpus=sum(len(r.gpus) for r in p.replicas),
                backfilled=p.backfilled or None,
            ),
        )
        if self.metrics is not None:
            self.metrics.decided("placed")
            if p.backfilled:
                self.metrics.decided("backfilled")
            if job.admitted_at is not None:
                self.metrics.waited([self.clock() - job.admitted_at])

    def _note_reservations(self, result: PlacementResult) -> None:
        """Reservations are not published (each cycle recomputes them): count and log them."""
        self.stats.reservations = len(result.reservations)
        if self.metrics is not None:
            self.metrics.reservations.set(len(result.reservations))
        self.stats.reserved_cycles += bool(result.reservations)
        for r in result.reservations:
            gpus = sum(len(x.gpus) for x in r.replicas)
            log.debug("placement: %s holds a reservation of %d GPUs from %.0f", r.job_id, gpus, r.start_at)
