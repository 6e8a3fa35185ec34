"""Where jobs run: ``place(snapshot, requests, now) -> PlacementResult``.

Also ``select_victims`` (topology-aware preemption), ``fragmentation`` (how
much free capacity large gangs cannot use) and ``propose_moves``
(defragmentation proposals, off unless called).
"""

from trainyard.core.placement.cycle import (
    ClusterSnapshot,
    NodeView,
    Placement,
    PlacementPolicy,
    PlacementRequest,
    PlacementResult,
    Reservation,
    RunningAlloc,
    Unplaced,
    place,
)
from trainyard.core.placement.defrag import Move, propose_moves
from trainyard.core.placement.preemption import VictimSet, select_victims
from trainyard.core.placement.scoring import fragmentation

__all__ = [
    "ClusterSnapshot",
    "Move",
    "NodeView",
    "Placement",
    "PlacementPolicy",
    "PlacementRequest",
    "PlacementResult",
    "Reservation",
    "RunningAlloc",
    "Unplaced",
    "VictimSet",
    "fragmentation",
    "place",
    "propose_moves",
    "select_victims",
]
