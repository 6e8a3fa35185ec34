"""Placement's cycle: admitted gangs in, ``JobPlaced`` out.

GPUs are taken by the ``JobPlaced`` event itself: the projection's Lua fold
writes each GPU's holder (fenced by run id) and frees it exactly once when the
run ends.  One leader per cluster decides, and it reads its own writes before
its next cycle, so no GPU is given twice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from trainyard.bus import Bus, PublishRequest, WrongLastSequence
from trainyard.core.placement import ClusterSnapshot, NodeView, PlacementRequest, place
from trainyard.domain.job import JobSpec
from trainyard.domain.node import NodeState
from trainyard.events import JobPlaced, subjects
from trainyard.store import Projector, Store
from trainyard.store import views

log = logging.getLogger(__name__)


class PlacementCycle:
    def __init__(
        self, bus: Bus, store: Store, projector: Projector, cluster: str, clock: Callable[[], float],
        node_projector: tuple[Projector, ...] = (),
    ) -> None:  # fmt: skip
        self.bus = bus
        self.store = store
        self.projector = projector
        self.projections = [projector, *node_projector]  # caught up before every snapshot
        self.cluster = cluster
        self.clock = clock
        self._specs: dict[str, JobSpec] = {}  # job id -> spec, for jobs waiting to be placed

    async def snapshot(self) -> tuple[ClusterSnapshot, list[PlacementRequest], dict[str, views.JobHead]]:
        admitted = await views.ids_in(self.store, "admitted")
        jobs = {j.job_id: j for j in await views.job_heads(self.store, admitted) if j.status == "admitted" and j.run_id}
        missing = [j for j in jobs if j not in self._specs]
        if missing:
            self._specs.update(await views.job_specs(self.store, missing))
        cluster = ClusterSnapshot(
            nodes=[
                NodeView(info=info, free_gpus=tuple(free), schedulable=state == NodeState.HEALTHY.value)
                for info, state, free in await views.node_views(self.store)
                if info.cluster == self.cluster
            ]
        )
        requests = [
            PlacementRequest(job_id=j.job_id, run_id=j.run_id or "", spec=self._specs[j.job_id], order=j.order)
            for j in jobs.values()
            if j.job_id in self._specs
        ]
        # Specs never change; forget those of jobs no longer waiting for placement.
        for job_id in [j for j in self._specs if j not in jobs]:
            del self._specs[job_id]
        return cluster, requests, jobs

    async def run_once(self) -> int:
        # 1. Snapshot the projection, once it holds everything the log holds.
        for projector in self.projections:
            await projector.caught_up()
        cluster, requests, jobs = await self.snapshot()
        if not requests:
            return 0
        # 2. Decide (pure).
        result = place(cluster, requests, self.clock())
        # 3. Publish, each fenced by the job's last subject sequence.
        publish = []
        for p in result.placements:
            job = jobs[p.job_id]
            event = JobPlaced(
                at=self.clock(), job_id=p.job_id, tenant=job.tenant, run_id=p.run_id, cluster=self.cluster, replicas=p.replicas
            )
            publish.append(
                PublishRequest(subjects.job(job.tenant, job.job_id), event, f"{p.run_id}:placed", job.last_seq)
            )
        results = await self.bus.publish_many(publish)
        for r in results:
            if isinstance(r, Exception) and not isinstance(r, WrongLastSequence):
                log.warning("placement publish failed: %r", r)
        # 4. Record why the others wait.
        await views.set_pending_reasons(self.store, {u.job_id: (u.reason.value, 0) for u in result.unplaced})
        # 5. Read our own writes before the next cycle.
        seqs = [r.seq for r in results if not isinstance(r, Exception)]
        if seqs:
            await self.projector.wait_for(max(seqs))
        return len(seqs)
