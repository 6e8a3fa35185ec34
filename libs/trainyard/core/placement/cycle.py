"""One placement cycle: put each admitted gang on free GPUs, all or nothing.

Each gang goes to the tightest topology domain that holds all of it, best fit
(see gang.py and scoring.py).  A gang that cannot start may get a
reservation; later, smaller gangs start only if they do not delay it
(backfill.py).  Every gang left waiting gets a reason.
"""

from __future__ import annotations

from collections.abc import Sequence

from trainyard.core.placement.backfill import Backfill, Release
from trainyard.core.placement.gang import fit_gang, undo, why_not
from trainyard.core.placement.probe import Probe
from trainyard.core.placement.snapshot import (
    ClusterSnapshot,
    NodeView,
    Placement,
    PlacementPolicy,
    PlacementRequest,
    PlacementResult,
    Reservation,
    RunningAlloc,
    Unplaced,
)
from trainyard.core.placement.topology import Topology
from trainyard.core.reasons import PendingReason
from trainyard.domain.job import JobSpec

__all__ = [
    "ClusterSnapshot",
    "Cycle",
    "NodeView",
    "Placement",
    "PlacementPolicy",
    "PlacementRequest",
    "PlacementResult",
    "Reservation",
    "RunningAlloc",
    "Unplaced",
    "place",
]

#: Reasons after which a gang may be given a reservation: it could start once others end.
RESERVABLE = frozenset(
    {
        PendingReason.INSUFFICIENT_GPUS,
        PendingReason.FRAGMENTED,
        PendingReason.TOPOLOGY,
        PendingReason.RESERVED_FOR_LARGER_JOB,
    }
)


def place(snapshot: ClusterSnapshot, requests: list[PlacementRequest], now: float) -> PlacementResult:
    """Place requests in order; each gang is placed whole or not at all."""
    cycle = Cycle(snapshot, now)
    for req in sorted(requests, key=lambda r: (r.order, r.job_id)):
        cycle.place_one(req)
    return cycle.result()


def build_topology(snapshot: ClusterSnapshot) -> Topology:
    return Topology.build((v.info, v.free_gpus, v.schedulable) for v in snapshot.nodes)


class Cycle:
    """The working state of one cycle; ``place`` drives it one request at a time."""

    def __init__(
        self,
        snapshot: ClusterSnapshot,
        now: float,
        topology: Topology | None = None,
        releases: Sequence[Release] | None = None,
    ) -> None:
        # 1. Our own copy of the cluster: a tree per GPU type with free-GPU aggregates.
        self.topo = topology if topology is not None else build_topology(snapshot)
        self.policy: PlacementPolicy = snapshot.policy
        self.now = now
        # 2. When every running job's GPUs come back, for reservations.
        self.backfill = Backfill(self.topo, now, snapshot.running, releases)
        self.placements: list[Placement] = []
        self.unplaced: list[Unplaced] = []
        self._probes: dict[int, tuple[JobSpec, Probe]] = {}  # id of a request's spec -> its probe, this cycle

    def _probe(self, spec: JobSpec) -> Probe:
        """The gang's aggregate check on this cycle's tree, built once per spec (a request holds its spec)."""
        found = self._probes.get(id(spec))
        if found is None or found[0] is not spec:
            found = self._probes[id(spec)] = (spec, Probe(self.topo, spec))
        return found[1]

    def place_one(self, req: PlacementRequest) -> Placement | Unplaced:
        spec = req.spec
        end = self.now + spec.max_runtime_s
        limit = self.policy.candidates_per_level
        # 3. Keep off the GPUs reserved for earlier gangs unless this one ends first.
        if self.backfill.reservations:
            self.backfill.mask_for(end)
        # (aggregates first: a gang that fits no domain at all is not searched for)
        replicas = None if self._probe(spec).now() is False else fit_gang(self.topo, spec, limit)
        if replicas is not None:
            placed = Placement(req.job_id, req.run_id, replicas, backfilled=bool(self.backfill.reservations))
            self.placements.append(placed)
            self.backfill.add_release(end, replicas)
            return placed
        # 4. Say why it waits: the cluster, its shape, or someone else's reservation.
        reason = self._reason(req)
        expected_start = None
        if (
            self.policy.backfill
            and reason in RESERVABLE
            and len(self.backfill.reservations) < self.policy.max_reservations
            and spec.total_gpus >= self.policy.reserve_min_gpus
        ):
            # 5. Reserve the GPUs it will get when running jobs end.
            reservation = self.backfill.reserve(req.job_id, req.run_id, spec, limit, self._probe(spec))
            if reservation is not None:
                expected_start = reservation.start_at
        waiting = Unplaced(req.job_id, req.run_id, reason, expected_start)
        self.unplaced.append(waiting)
        return waiting

    def _reason(self, req: PlacementRequest) -> PendingReason:
        if not self.backfill.masked:
            return why_not(self.topo, req.spec)
        masked = self.backfill.mask_set
        self.backfill.unmask()
        try:
            quick = self._probe(req.spec).now()
            replicas = None if quick is False else fit_gang(self.topo, req.spec, self.policy.candidates_per_level)
            if replicas is not None:
                undo(self.topo, [(0, "", self.topo.nodes[r.node_id], r.gpus) for r in replicas])
                return PendingReason.RESERVED_FOR_LARGER_JOB
            return why_not(self.topo, req.spec)
        finally:
            self.backfill.set_mask(list(masked))

    def result(self) -> PlacementResult:
        self.backfill.unmask()
        return PlacementResult(
            placements=list(self.placements),
            unplaced=list(self.unplaced),
            reservations=list(self.backfill.reservations),
        )
