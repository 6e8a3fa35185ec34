"""Composition root of the placement service.

Every process projects JOBS and NODES; only the holder of the cluster's
placement lease decides.  A standby's projections stay current, so when the
leader's lease expires it takes over at its next cycle with nothing to replay.
"""

from __future__ import annotations

import os
import time

from trainyard.bus.lease import Lease
from trainyard.cycles import decision_loop
from trainyard.runtime import Runtime, run_tasks, serve
from trainyard.store import Projector
from trainyard_placement.handlers import PlacementCycle


def lease_key(cluster: str) -> str:
    """The KV key of a cluster's placement lease; its value is the leader's pid."""
    return f"placement.{cluster}"


async def main(rt: Runtime) -> None:
    jobs = Projector(rt.bus, rt.store, "JOBS")
    nodes = Projector(rt.bus, rt.store, "NODES")
    lease = await Lease.open(rt.bus, lease_key(rt.settings.cluster), holder=f"{os.getpid()}")
    cycle = PlacementCycle(rt.bus, rt.store, jobs, rt.settings.cluster, time.time, node_projector=(nodes,), lease=lease)
    try:
        await run_tasks(
            rt.stop,
            jobs.run(rt.stop),
            nodes.run(rt.stop),
            lease.keep(rt.stop),
            decision_loop(rt, cycle.run_once, lease, [jobs, nodes], "placement"),
        )
    finally:
        await lease.release()


def run() -> None:
    serve("placement", main)
