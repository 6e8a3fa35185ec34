"""Composition root of the admission service."""

from __future__ import annotations

import asyncio
import os
import time

from trainyard.bus import ConsumerSpec, run_consumer
from trainyard.bus.lease import Lease
from trainyard.config.store import ConfigStore
from trainyard.core.admission import AdmissionPolicy
from trainyard.cycles import decision_loop
from trainyard.events import subjects
from trainyard.ledger.archive import JobArchive
from trainyard.observability.metrics import AdmissionMetrics, ProjectionMetrics, refresh_every, serve_metrics
from trainyard.runtime import Runtime, redis_options, run_tasks, serve
from trainyard.store import Projector, Store
from trainyard.store.projections import RedisProjections
from trainyard.store.retention import run_sweeper
from trainyard.store.snapshot import run_snapshotter, snapshot_store
from trainyard_admission.cycle import AdmissionCycle
from trainyard_admission.handlers import IntakeHandler
from trainyard_admission.tenancy import TenancyHolder


async def main(rt: Runtime) -> None:
    snapshots = snapshot_store(rt.settings)
    jobs = Projector(rt.bus, rt.store, "JOBS", snapshots)
    nodes = Projector(rt.bus, rt.store, "NODES")
    tenancy = TenancyHolder()
    config = await ConfigStore.open(rt.bus, replicas=rt.settings.stream_replicas)
    metrics = AdmissionMetrics()
    projections = ProjectionMetrics(metrics.registry, [jobs, nodes])
    serve_metrics("admission", metrics.registry, rt.settings)
    # Finished jobs leave the projection after their retention, archived in the ledger database first.
    archive = JobArchive(rt.settings.ledger_url) if rt.settings.ledger_url else None
    sweeper = (
        run_sweeper(rt.stop, rt.store, archive, rt.settings.job_retention_s, rt.settings.retention_sweep_interval_s)
        if archive is not None
        else rt.stop.wait()
    )
    # and the JOBS projection is kept as a snapshot there, for a rebuild once the stream dropped old events
    # (on a client of its own that waits as long as the copy takes: it holds Redis for all of it)
    copier = Store.from_url(
        rt.settings.redis_url, rt.settings.redis_prefix, socket_timeout=600, **redis_options(rt.settings)
    )
    snapshotter = (
        run_snapshotter(rt.stop, copier, snapshots, rt.settings.jobs_snapshot_interval_s)
        if snapshots is not None
        else rt.stop.wait()
    )
    intake = IntakeHandler(RedisProjections(rt.bus, rt.store, archive), time.time, tenancy, metrics=metrics)
    cycle = AdmissionCycle(
        rt.bus,
        rt.store,
        jobs,
        AdmissionPolicy(),
        time.time,
        node_projector=(nodes,),
        tenancy=tenancy,
        placement_timeout_s=rt.settings.placement_timeout_s,
        preempt_kill_margin_s=rt.settings.preempt_kill_margin_s,
        cluster=rt.settings.cluster,
        metrics=metrics,
    )
    lease = await Lease.open(
        rt.bus, f"admission.{rt.settings.cluster}", holder=f"{os.getpid()}", replicas=rt.settings.stream_replicas
    )
    # the backlog is read before the lease is contended for: a first cycle as leader re-reads only what changed
    ready = asyncio.Event()
    spec = ConsumerSpec(stream="INTAKE", durable="admission-intake", filter_subject=subjects.INTAKE_ALL)
    try:
        await run_tasks(
            rt.stop,
            jobs.run(rt.stop),
            nodes.run(rt.stop),
            lease.keep(rt.stop, after=ready),
            config.follow(tenancy.use, rt.stop),
            run_consumer(rt.bus, spec, intake, rt.stop),
            decision_loop(
                rt, cycle.run_once, lease, [jobs, nodes], "admission", metrics, standby=cycle.warm, ready=ready
            ),
            refresh_every(rt.stop, lambda: projections.refresh(rt.bus)),
            sweeper,
            snapshotter,
        )
    finally:
        await lease.release()
        for database in (archive, snapshots):
            if database is not None:
                database.close()
        await copier.close()


def run() -> None:
    serve("admission", main)
