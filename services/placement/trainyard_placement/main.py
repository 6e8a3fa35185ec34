"""Composition root of the placement service."""

from __future__ import annotations

import os
import time

from trainyard.bus.lease import Lease
from trainyard.runtime import Runtime, run_tasks, serve
from trainyard.store import Projector
from trainyard.cycles import decision_loop
from trainyard_placement.handlers import PlacementCycle


async def main(rt: Runtime) -> None:
    jobs = Projector(rt.bus, rt.store, "JOBS")
    nodes = Projector(rt.bus, rt.store, "NODES")
    cycle = PlacementCycle(rt.bus, rt.store, jobs, rt.settings.cluster, time.time, node_projector=(nodes,))
    lease = await Lease.open(rt.bus, f"placement.{rt.settings.cluster}", holder=f"{os.getpid()}")
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
