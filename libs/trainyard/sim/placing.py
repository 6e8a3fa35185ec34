"""The placement cycle on the simulator's live topology tree.

``place`` (trainyard.core.placement) builds a tree from the snapshot's nodes
and then drives a ``Cycle`` request by request.  This does exactly the same
over the tree the simulator keeps alive, so a cycle costs what its requests
cost instead of O(nodes).  Placements stay taken in the tree; everything else
the cycle tried (reservation masks, failed fits) is given back by the cycle.
"""

from __future__ import annotations

from collections.abc import Sequence

from trainyard.core.placement import ClusterSnapshot, PlacementPolicy, PlacementRequest, PlacementResult, RunningAlloc
from trainyard.core.placement.backfill import Release
from trainyard.core.placement.cycle import Cycle
from trainyard.sim.cluster import SimCluster


def place_live(
    cluster: SimCluster,
    running: list[RunningAlloc],
    policy: PlacementPolicy,
    requests: list[PlacementRequest],
    now: float,
    releases: Sequence[Release] | None = None,
) -> PlacementResult:
    """``place(cluster.snapshot(running, policy), requests, now)`` without rebuilding the tree; ``releases``:
    the holders' (latest end, replicas), earliest first, kept by the caller (``ReleaseOrder``)."""
    snapshot = ClusterSnapshot(nodes=[], running=running, policy=policy)
    cycle = Cycle(snapshot, now, topology=cluster.topo, releases=releases)
    for req in sorted(requests, key=lambda r: (r.order, r.job_id)):
        cycle.place_one(req)
    return cycle.result()
