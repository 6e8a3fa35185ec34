"""Where jobs run: ``place(snapshot, requests, now) -> PlacementResult``."""

from trainyard.core.placement.cycle import (
    ClusterSnapshot,
    NodeView,
    Placement,
    PlacementRequest,
    PlacementResult,
    Unplaced,
    place,
)

__all__ = ["ClusterSnapshot", "NodeView", "Placement", "PlacementRequest", "PlacementResult", "Unplaced", "place"]
