"""What one simulation is set up with, what it tracks per job, and the kinds
of event on its clock."""

from __future__ import annotations

import msgspec

from trainyard.core.admission import PendingJob, RunningJob
from trainyard.core.placement import RunningAlloc
from trainyard.sim.failures import NO_FAILURES, FailureModel
from trainyard.sim.workloads import SimJob

#: The kinds of event on the simulator's heap; events at the same time run in this order (a cycle at the
#: moment of a checkpoint sees it).
ARRIVE, FINISH, FAIL, DETECT, STOP, REPAIR, CHECKPOINT, TICK = range(8)


class Scenario(msgspec.Struct, frozen=True):
    tick_s: float = 60.0  # scheduling cycles at most this often (virtual seconds); 0: on every change
    seed: int = 0
    failures: FailureModel = NO_FAILURES
    borrowing: bool = True  # tenants may use quota others leave idle
    check_every: int = 0  # check the invariants every N cycles; 0: never
    record_events: bool = True  # keep the job event log (memory grows with the workload)
    sample_s: float = 3600.0  # utilisation timeline resolution
    fragmentation_samples: int = 48  # times the fragmentation of free GPUs is measured
    horizon_s: float | None = None  # stop here even if jobs remain
    trace_decisions: bool = False  # keep every cycle's snapshots and decisions (tests; costs O(nodes) a cycle)


class JobState:
    """What the simulator knows of one job across its attempts."""

    __slots__ = (
        "job",
        "status",
        "attempt",
        "run_id",
        "remaining",
        "order",
        "first_start",
        "end",
        "placed_at",
        "alloc",
        "running",
        "gpus_lost",
        "failures",
        "preemptions",
        "spec",
        "failed_at",
        "overhead",
        "attained",
        "not_before",
        "lost_to_preemption",
        "shown",
    )

    def __init__(self, job: SimJob, order: int) -> None:
        self.job = job
        self.status = "future"  # future, pending, admitted, running, done, failed, rejected
        self.attempt = 0
        self.run_id = ""
        self.remaining = job.duration  # seconds of work still to do
        self.order = order  # key inside the queue (lower first)
        self.first_start: float | None = None
        self.end: float | None = None
        self.placed_at = 0.0  # when the current run started
        self.alloc: RunningAlloc | None = None
        self.running: RunningJob | None = None
        self.gpus_lost = 0.0  # GPU-seconds of work thrown away by failures and preemption
        self.lost_to_preemption = 0.0  # the part thrown away by preemption (restart, work since the checkpoint)
        self.failures = 0
        self.preemptions = 0
        self.spec = None
        self.failed_at: float | None = None  # the current run's node failed at this time
        self.overhead = 0.0  # restart overhead of the current run
        self.attained = 0.0  # GPU-seconds its ended runs held (least-attained-service order; from the fold)
        self.not_before: float | None = None  # retry backoff after its own failure (from the lifecycle fold)
        # what admission was last shown of it while pending, and under which queue key: a job gets a new key
        # whenever its order, priority, backoff or history moves (requeued, promoted, reprioritised)
        self.shown: tuple[tuple[int, int, int, int], PendingJob] | None = None
