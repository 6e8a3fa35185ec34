"""Order inside a queue, and the checks that need no usage at all.

Inside a queue jobs go by priority (higher first), then submission order, then
job id so that ties break the same way every time.  Across queues the cycle
takes the queue whose next job has the best *class* and, within a class, the
smallest fair share:

- class 0: the gang fits inside the queue's own nominal quota;
- class 1: the gang needs to borrow;
- class 2: the job may only borrow (best effort).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence
from itertools import pairwise
from operator import attrgetter
from typing import NamedTuple

from trainyard.core.admission.quota import Demand
from trainyard.core.admission.snapshot import PendingJob
from trainyard.core.admission.tree import Scheduling
from trainyard.core.reasons import PendingReason

WITHIN_NOMINAL, BORROWING, BORROW_ONLY = 0, 1, 2


def queue_order(job: PendingJob) -> tuple[int, int, str]:
    """Sort key inside one queue: priority, then submission order."""
    return (-job.priority, job.order, job.job_id)


def level_bounds(scheduling: Scheduling) -> list[float]:
    """Attained GPU-seconds at which a job moves down a least-attained-service level."""
    return [h * 3600.0 for h in scheduling.service_levels_gpu_h]


def service_level(bounds: Sequence[float], attained_gpu_s: float) -> int:
    """The least-attained-service level of a job that has received ``attained_gpu_s`` (0: the first)."""
    return bisect_right(bounds, attained_gpu_s) if attained_gpu_s > 0 else 0


class ServiceOrder(NamedTuple):
    """Least attained service inside a queue, after priority: see :func:`service_order`."""

    levels: list[float]  # attained GPU-seconds at which a job moves down a level
    starved_before: float  # a job submitted before this goes ahead of every level (aging)


def service_order(scheduling: Scheduling, now: float) -> ServiceOrder | None:
    """How to rank jobs inside a queue after priority, or None for plain submission order.

    Least attained service (Tiresias-like, without knowing run times): jobs
    whose earlier runs received fewer GPU-hours go first, by levels, each
    level in submission order; a job that has waited ``starvation_s`` goes
    ahead of every level.
    """
    if scheduling.order != "las":
        return None
    return ServiceOrder(level_bounds(scheduling), now - scheduling.starvation_s)


def group_pending(
    pending: Iterable[PendingJob], order: ServiceOrder | None = None
) -> dict[tuple[str, str], list[PendingJob]]:
    """Pending jobs by ``(tenant, queue)``, each list by priority, then ``order``'s rank (if any), then
    submission order, then job id.

    Three stable sorts on keys read in C (submission order, rank, priority) rather than one on a key
    built in Python for every job: the same order, a fraction of the time."""
    jobs = sorted(pending, key=attrgetter("order"))
    if any(a.order == b.order for a, b in pairwise(jobs)):
        jobs.sort(key=attrgetter("order", "job_id"))  # equal submission order: job id breaks the tie
    if order is not None:
        starved_before, levels = order.starved_before, order.levels
        rank = [
            -1
            if (at := job.submitted_at) is not None and at < starved_before
            else (bisect_right(levels, got) if (got := job.attained_gpu_s) > 0 else 0)
            for job in jobs
        ]  # -1: starved (ahead of every level); else the service level
        if rank and min(rank) != max(rank):
            jobs = [jobs[k] for k in sorted(range(len(jobs)), key=rank.__getitem__)]  # stable: by rank, then as above
    jobs.sort(key=attrgetter("priority"), reverse=True)  # stable: equal priorities keep the order above
    return group_in_order(jobs)


def group_in_order(jobs: Iterable[PendingJob]) -> dict[tuple[str, str], list[PendingJob]]:
    """Pending jobs by ``(tenant, queue)``, each list in the order given (a caller that keeps every queue in
    :func:`group_pending`'s order already)."""
    groups: dict[tuple[str, str], list[PendingJob]] = {}
    for job in jobs:
        pair = (job.tenant, job.queue)
        group = groups.get(pair)
        if group is None:
            groups[pair] = [job]
        else:
            group.append(job)
    return groups


def demand_of(gpus_by_type: dict[str, int], fidx: dict[str, int]) -> Demand | None:
    """The gang's demand by type number; None when it names a type nobody has."""
    demand: Demand = []
    for t, n in gpus_by_type.items():
        i = fidx.get(t)
        if i is None:
            if n > 0:
                return None
        elif n > 0:
            demand.append((i, n))
    return demand


def never_fits(demand: Demand, capacity: list[int], ceiling: list[int]) -> PendingReason | None:
    """Why the gang could not run even on an idle cluster, if it could not."""
    for i, d in demand:
        if capacity[i] <= 0:
            return PendingReason.NO_CAPACITY_OF_TYPE
        if d > capacity[i]:
            return PendingReason.GANG_LARGER_THAN_CLUSTER
    for i, d in demand:
        if ceiling[i] <= 0:
            return PendingReason.NO_QUOTA_FOR_TYPE
        if d > ceiling[i]:
            return PendingReason.GANG_LARGER_THAN_QUOTA
    return None


class DemandCache:
    """Demand of many gangs, converted once per distinct request: equal requests get the same
    :data:`Demand` object, kept alive as long as the cache is (a cycle may key on its ``id``)."""

    __slots__ = ("fidx", "single", "multi")

    def __init__(self, fidx: dict[str, int]) -> None:
        self.fidx = fidx
        self.single: dict[tuple[str, int], Demand | None] = {}  # (type, GPUs) -> demand
        self.multi: dict[tuple[tuple[str, int], ...], Demand | None] = {}  # the items in order -> demand

    def __call__(self, gpus_by_type: dict[str, int]) -> Demand | None:
        if len(gpus_by_type) != 1:
            items = tuple(gpus_by_type.items())
            try:
                return self.multi[items]
            except KeyError:
                demand = self.multi[items] = demand_of(gpus_by_type, self.fidx)
                return demand
        (key,) = gpus_by_type.items()  # (type, GPUs): the item itself is the key
        try:
            return self.single[key]
        except KeyError:
            demand = self.single[key] = demand_of(gpus_by_type, self.fidx)
            return demand
