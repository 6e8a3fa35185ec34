"""What placement reads and what it decides: the snapshot, requests and result.

Every field added after the first release has a default, so an older
producer of snapshots (or an older consumer of results) keeps working.
"""

from __future__ import annotations

import msgspec

from trainyard.core.reasons import PendingReason
from trainyard.domain.job import JobSpec
from trainyard.domain.node import NodeInfo
from trainyard.events.jobs import ReplicaPlacement


class NodeView(msgspec.Struct, frozen=True):
    info: NodeInfo
    free_gpus: tuple[int, ...]  # indices of GPUs not held by any run
    schedulable: bool = True


class RunningAlloc(msgspec.Struct, frozen=True):
    """A run that holds GPUs now; backfill and preemption plan around it."""

    job_id: str
    run_id: str
    replicas: list[ReplicaPlacement]  # where each replica runs and on which GPUs
    started_at: float  # seconds since the Unix epoch
    max_runtime_s: float  # the run is stopped at started_at + max_runtime_s at the latest
    preemptible: bool = False  # admission may stop it to make room
    last_checkpoint_at: float | None = None  # work after this is lost when the run stops
    priority: int = 0

    @property
    def expected_end(self) -> float:
        return self.started_at + self.max_runtime_s

    @property
    def gpus(self) -> int:
        return sum(len(r.gpus) for r in self.replicas)

    def lost_gpu_seconds(self, now: float) -> float:
        """GPU-seconds of work that stopping this run at ``now`` throws away."""
        since = self.last_checkpoint_at if self.last_checkpoint_at is not None else self.started_at
        return self.gpus * max(0.0, now - since)


class PlacementPolicy(msgspec.Struct, frozen=True):
    backfill: bool = True  # let later jobs start when they do not delay a reservation
    max_reservations: int = 1  # blocked gangs that get a reservation per cycle (1 is EASY backfill)
    reserve_min_gpus: int = 1  # only gangs at least this large get a reservation
    candidates_per_level: int = 32  # domains tried per topology level before going wider


class ClusterSnapshot(msgspec.Struct, frozen=True):
    nodes: list[NodeView]
    running: list[RunningAlloc] = []  # runs holding GPUs, with their expected ends
    policy: PlacementPolicy = PlacementPolicy()


class PlacementRequest(msgspec.Struct, frozen=True):
    job_id: str
    run_id: str
    spec: JobSpec
    order: int  # lower is placed first


class Placement(msgspec.Struct, frozen=True):
    job_id: str
    run_id: str
    replicas: list[ReplicaPlacement]
    backfilled: bool = False  # started ahead of an earlier job that holds a reservation


class Unplaced(msgspec.Struct, frozen=True):
    job_id: str
    run_id: str
    reason: PendingReason
    expected_start: float | None = None  # when its reservation begins, if it holds one


class Reservation(msgspec.Struct, frozen=True):
    """GPUs promised to a blocked gang from ``start_at`` (EASY backfill)."""

    job_id: str
    run_id: str
    start_at: float  # latest time the planned GPUs are all free, from running jobs' limits
    replicas: list[ReplicaPlacement]  # the planned placement at start_at


class PlacementResult(msgspec.Struct, frozen=True):
    placements: list[Placement]
    unplaced: list[Unplaced]
    reservations: list[Reservation] = []
