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

from collections.abc import Iterable

from trainyard.core.admission.quota import Demand
from trainyard.core.admission.snapshot import PendingJob, queue_key
from trainyard.core.reasons import PendingReason

WITHIN_NOMINAL, BORROWING, BORROW_ONLY = 0, 1, 2


def queue_order(job: PendingJob) -> tuple[int, int, str]:
    """Sort key inside one queue: priority, then submission order."""
    return (-job.priority, job.order, job.job_id)


def group_pending(pending: Iterable[PendingJob]) -> dict[str, list[PendingJob]]:
    """Pending jobs by ``"tenant/queue"``, each list in queue order."""
    groups: dict[str, list[PendingJob]] = {}
    for job in pending:
        key = queue_key(job.tenant, job.queue)
        group = groups.get(key)
        if group is None:
            groups[key] = [job]
        else:
            group.append(job)
    for group in groups.values():
        group.sort(key=queue_order)
    return groups


def demand_of(gpus_by_type: dict[str, int], fidx: dict[str, int]) -> Demand | None:
    """The gang's demand by type number; None when it names a type nobody has."""
    demand: Demand = []
    for t, n in gpus_by_type.items():
        if n <= 0:
            continue
        i = fidx.get(t)
        if i is None:
            return None
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
