"""Composition root of the placement service.

Every process projects JOBS and NODES; only the holder of the cluster's
placement lease decides.  A standby's projections stay current, so when the
leader's lease expires it takes over at its next cycle with nothing to replay.
``TRAINYARD_PLACEMENT_BINDER=kube`` also binds placed runs to their Kubernetes
Jobs or JobSets (binding.py).  The leader also runs the run dispatcher
(dispatch.py): orders to the node agents of runs placed on executing nodes,
and their reports turned into the runs' lifecycle events.
"""

from __future__ import annotations

import functools
import os
import sys
import time

from trainyard.bus.lease import Lease
from trainyard.cycles import decision_loop
from trainyard.observability.metrics import PlacementMetrics, ProjectionMetrics, refresh_every, serve_metrics
from trainyard.runtime import Runtime, run_tasks, serve
from trainyard.settings import ConfigurationError
from trainyard.store import Projector
from trainyard.store.snapshot import snapshot_store
from trainyard_placement.dispatch import RunDispatcher
from trainyard_placement.handlers import Binding, PlacementCycle
from trainyard_placement.settings import binder_kind, load_settings


def lease_key(cluster: str) -> str:
    """The KV key of a cluster's placement lease; its value is the leader's pid."""
    return f"placement.{cluster}"


def binding_for(kind: str) -> Binding | None:
    """The binder ``TRAINYARD_PLACEMENT_BINDER`` asks for (settings.binder_kind)."""
    if kind != "kube":
        return None
    from trainyard.kube.binder import KubeBinder  # loads the Kubernetes client and its config
    from trainyard_placement.binding import KubeBinding

    return KubeBinding(KubeBinder(), time.monotonic)


async def main(rt: Runtime, binder: str = "none") -> None:
    binding = binding_for(binder)
    jobs = Projector(rt.bus, rt.store, "JOBS", snapshot_store(rt.settings))
    nodes = Projector(rt.bus, rt.store, "NODES")
    lease = await Lease.open(
        rt.bus, lease_key(rt.settings.cluster), holder=f"{os.getpid()}", replicas=rt.settings.stream_replicas
    )
    metrics = PlacementMetrics()
    projections = ProjectionMetrics(metrics.registry, [jobs, nodes])
    serve_metrics("placement", metrics.registry, rt.settings)
    cycle = PlacementCycle(
        rt.bus,
        rt.store,
        jobs,
        rt.settings.cluster,
        time.time,
        node_projector=(nodes,),
        lease=lease,
        binding=binding,
        metrics=metrics,
    )
    dispatcher = RunDispatcher(
        rt.bus, rt.store, rt.settings.cluster, time.time, lease=lease, start_timeout_s=rt.settings.start_timeout_s
    )
    try:
        await run_tasks(
            rt.stop,
            jobs.run(rt.stop),
            dispatcher.run(rt.stop),
            nodes.run(rt.stop),
            lease.keep(rt.stop),
            decision_loop(rt, cycle.run_once, lease, [jobs, nodes], "placement", metrics),
            refresh_every(rt.stop, lambda: projections.refresh(rt.bus)),
        )
    finally:
        await lease.release()


def run() -> None:
    try:
        binder = binder_kind(load_settings())
    except ConfigurationError as err:
        print(f"trainyard-placement: {err}", file=sys.stderr)
        raise SystemExit(2) from err
    serve("placement", functools.partial(main, binder=binder))
