"""One admission cycle: ``admit(snapshot, policy, now) -> AdmissionResult``.

Without a tenancy (``policy.tenancy is None``) the policy is first-in-first-out
per GPU type while GPUs are free: a job whose GPU type is blocked by an earlier
job waits behind it, so a large job is never overtaken by smaller ones.

With a tenancy, each cycle:

1. indexes the quota tree and loads the usage of every running job;
2. orders each queue by priority, then submission order;
3. repeatedly takes the queue whose next job is best by class (within nominal
   quota, borrowing, best effort) and then by smallest fair share, and admits
   that job if its whole gang fits the quota tree and the free GPUs;
4. a job that does not fit blocks the later jobs of its queue that need the
   same GPU types, and reserves the capacity it waits for against borrowing
   jobs of queues further along in fair-share order;
5. lets the jobs that blocked (a bounded number) look for preemption victims;
6. gives every job left waiting a reason and its place in its queue.
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush

from trainyard.core.admission.backfill import Shadows
from trainyard.core.admission.candidates import Blocked, HolderTable, group_holders, load_holders
from trainyard.core.admission.fairshare import FairShare
from trainyard.core.admission.ordering import (
    BORROW_ONLY,
    BORROWING,
    WITHIN_NOMINAL,
    DemandCache,
    group_in_order,
    group_pending,
    level_bounds,
    never_fits,
    service_order,
)
from trainyard.core.admission.preemption import LazyCluster, preempt_or_screen
from trainyard.core.admission.quota import Demand, QuotaState
from trainyard.core.admission.snapshot import (
    AdmissionPolicy,
    AdmissionResult,
    AdmissionSnapshot,
    Admit,
    PendingJob,
    Preemption,
    RunningJob,
    Waiting,
)
from trainyard.core.admission.tree import Tenancy, TreeIndex
from trainyard.core.placement.topology import Topology
from trainyard.core.reasons import PendingReason

__all__ = [
    "AdmissionPolicy",
    "AdmissionResult",
    "AdmissionSnapshot",
    "Admit",
    "PendingJob",
    "Preemption",
    "RunningJob",
    "Waiting",
    "admit",
]

BACKOFF = PendingReason.BACKOFF
QUEUED_BEHIND = PendingReason.QUEUED_BEHIND
FAIR_SHARE = PendingReason.FAIR_SHARE
INSUFFICIENT_GPUS = PendingReason.INSUFFICIENT_GPUS
RESERVED = PendingReason.RESERVED_FOR_LARGER_JOB
COHORT_EXHAUSTED = PendingReason.COHORT_EXHAUSTED
NOBODY = 3  # reservation level that blocks no class
UNKNOWN: Demand = []  # a request not converted yet (compared by identity)
inf = float("inf")


def admit(
    snapshot: AdmissionSnapshot,
    policy: AdmissionPolicy,
    now: float,
    holders: HolderTable | None = None,
    topology: Topology | None = None,
    cluster: LazyCluster | None = None,
) -> AdmissionResult:
    """Decide which pending jobs to admit now, whom to preempt, and why the rest wait.

    ``holders``: ``snapshot.running`` already summed by a caller that keeps them from cycle to cycle (the
    simulator); the decision is the same as without it.  ``topology``: the tree of ``snapshot.cluster``'s
    schedulable nodes, kept by such a caller; the preemption pass works on it instead of building one (its
    nodes are then not read) and leaves it as it found it.

    ``cluster``, for a snapshot without one: the cluster and the pending jobs' specs, asked for only when
    choosing victims by GPU counts would preempt; the pass is then run again on the cluster.  The result is
    the snapshot's decision if no run would be stopped by counts, else the decision with that cluster (what a
    caller that decides again with the cluster whenever the first decision preempts gets, in one walk of the
    pending jobs)."""
    if policy.tenancy is None:
        return _admit_fifo(snapshot, policy, now)
    return _admit_with_tenancy(snapshot, policy, policy.tenancy, now, holders, topology, cluster)


def _admit_with_tenancy(
    snapshot: AdmissionSnapshot,
    policy: AdmissionPolicy,
    tenancy: Tenancy,
    now: float,
    table: HolderTable | None,
    topology: Topology | None,
    lazy_cluster: LazyCluster | None,
) -> AdmissionResult:
    # 1. Index the tree; load what running jobs hold.
    flavors = list(snapshot.capacity)
    if table is not None and len(table) != len(snapshot.running):
        raise ValueError(f"the holder table has {len(table)} runs and the snapshot {len(snapshot.running)}")
    kept = table is not None and table.serves(tenancy, flavors)
    index = table.index if table is not None and kept else TreeIndex(tenancy, flavors)
    fidx, nf = index.fidx, len(index.flavors)
    capacity = [snapshot.capacity.get(f, 0) for f in index.flavors]
    state = QuotaState(index)
    demands = DemandCache(fidx)
    loaded = table.holdings() if table is not None and kept else load_holders(snapshot.running, index, demands)
    holders, held, usage, lowest, noticed = loaded
    for (node, borrow_only), row in usage.items():
        state.take(node, [(i, d) for i, d in enumerate(row) if d], borrow_only)
    free = [capacity[i] - max(snapshot.in_use.get(f, 0), held[i]) for i, f in enumerate(index.flavors)]
    shares = FairShare(index, state.usage, capacity, snapshot.usage_history, tenancy.half_life_s)

    scheduling = tenancy.scheduling
    kept_ends = table.releases() if table is not None and kept else None
    shadows = Shadows(nf, holders, now, kept_ends) if scheduling.backfill else None
    root_limit, root_claim = index.limit[0], state.claim[0]
    reserve_after = scheduling.reserve_after_s
    claimed = [False] * nf  # types a blocked job may already preempt for this cycle
    # least attained service: besides the first blocked job of each type, any job short of GPUs may stop a run
    # that has received more service (preemption.py checks whose and how long it ran)
    levels = level_bounds(scheduling) if tenancy.preemption.attained_service and scheduling.order == "las" else None

    # 2. Queues in priority, then service (or submission) order.
    waiting: list[Waiting] = []
    queue_jobs: dict[int, list[PendingJob]] = {}
    if snapshot.pending_in_order:
        grouped = group_in_order(snapshot.pending)
    else:
        grouped = group_pending(snapshot.pending, service_order(scheduling, now))
    for (tenant, name), jobs in grouped.items():
        q = index.queue_by_pair.get((tenant, name))
        if q is None:
            waiting.extend(Waiting(job.job_id, PendingReason.UNKNOWN_QUEUE, p) for p, job in enumerate(jobs, 1))
        else:
            queue_jobs[q] = jobs

    def head_class(q: int, job: PendingJob) -> int:
        if job.may_only_borrow:
            return BORROW_ONLY
        demand = demands(job.gpus_by_type)
        if demand is None or state.within_nominal(q, demand):
            return WITHIN_NOMINAL
        return BORROWING

    # 3. Take the best queue, try its next job, put the queue back when a job is admitted.
    heap = [(head_class(q, jobs[0]), shares.share[q], q) for q, jobs in queue_jobs.items()]
    heapify(heap)
    cursor = dict.fromkeys(queue_jobs, 0)
    queue_blocked = {q: [False] * nf for q in queue_jobs}  # types later jobs of the queue wait behind
    reserved = [[NOBODY] * nf for _ in index.names]  # lowest class a waiting job holds capacity against
    admitted: list[Admit] = []
    blocked: list[Blocked] = []  # jobs that blocked their queue: candidates to preempt for
    room = policy.max_admissions_per_cycle
    most_preemptors = policy.max_preemptors_per_cycle
    add_waiting = waiting.append
    # each pending job's demand by the id of its request (the snapshot keeps every request alive): a caller whose
    # equal requests share one dict has each converted once
    by_request: dict[int, Demand | None] = {}
    checked: dict[tuple[int, int, bool], tuple[PendingReason, int] | None] = {}  # quota answers since the last take
    while heap:
        popped_class, _, q = heappop(heap)
        jobs, i, n_jobs = queue_jobs[q], cursor[q], len(queue_jobs[q])
        qblock, path, nominal, regular = queue_blocked[q], index.paths[q], index.nominal[q], state.regular[q]
        ceilings = index.ceiling[q], index.ceiling_borrow_only[q]
        # larger gangs could never run here: for ordinary and for borrow-only jobs
        largest = [[min(capacity[t], ceiling[t]) for t in range(nf)] for ceiling in ceilings]
        while i < n_jobs:
            job = jobs[i]
            i += 1
            if job.not_before is not None and job.not_before > now:
                add_waiting(Waiting(job.job_id, BACKOFF, i))
                continue
            asked = job.gpus_by_type
            demand = by_request.get(id(asked), UNKNOWN)
            if demand is UNKNOWN:
                demand = by_request[id(asked)] = demands(asked)
            if demand is None:
                add_waiting(Waiting(job.job_id, PendingReason.NO_CAPACITY_OF_TYPE, i))
                continue
            borrow_only = job.may_only_borrow
            behind = within = False
            static = None
            most = largest[borrow_only]
            for t, d in demand:
                if d > most[t]:
                    static = never_fits(demand, capacity, ceilings[borrow_only])
                    break
                if qblock[t]:
                    behind = True
            if static is not None:
                add_waiting(Waiting(job.job_id, static, i))
                continue
            if behind or not room:
                add_waiting(Waiting(job.job_id, QUEUED_BEHIND, i))
                for t, _ in demand:
                    qblock[t] = True
                continue
            if borrow_only:
                cls = BORROW_ONLY
            else:
                within = True
                for t, d in demand:
                    if regular[t] + d > nominal[t]:
                        within = False
                cls = WITHIN_NOMINAL if within else BORROWING
            if cls > popped_class:
                i -= 1  # its class is worse than the one it was chosen for: queue again
                heappush(heap, (cls, shares.share[q], q))
                break
            # 4. Does the gang fit the quota tree, the reservations and the free GPUs?  (The quota answer is
            #    the same for every equal request of the queue until the next admission changes the usage.)
            key = (q, id(demand), borrow_only)  # demands are the DemandCache's: one object per request
            if key in checked:
                fail = checked[key]
            else:
                fail = checked[key] = state.check(q, demand, borrow_only)
            reason = None if fail is None else fail[0]
            if fail is None:
                for t, d in demand:
                    if free[t] < d:
                        reason, fail = INSUFFICIENT_GPUS, (INSUFFICIENT_GPUS, 0)
                    for n in path:
                        if reserved[n][t] <= cls:
                            reason = FAIR_SHARE
                            break
                    if reason is FAIR_SHARE:
                        break
            start: float | None = inf
            # short of GPUs it could get now (always so when too few are free), or of the whole tree's quota
            if shadows is not None and (
                reason is INSUFFICIENT_GPUS
                or (
                    reason is COHORT_EXHAUSTED
                    and fail is not None
                    and not fail[1]
                    and _short_of(demand, free, root_limit, root_claim)
                )
            ):
                if not (scheduling.reserve and (job.submitted_at is None or now - job.submitted_at >= reserve_after)):
                    start = None  # it waits without a reservation and without holding up the line
                elif shadows.holds_all(demand):
                    start = None  # earlier jobs hold the reservations of all its types
                else:
                    short = [min(free[t], root_limit[t] - root_claim[t]) for t in range(nf)]  # GPUs it could get now
                    start = shadows.reserve(job.job_id, demand, short)
            if start is None or start < inf:
                # backfill: short of GPUs (or of the whole tree's quota, the same thing), the job waits without
                # holding up the line.  Only the first such job of each type may make room by preemption, so
                # two jobs never preempt for the same GPUs: for priority at once, to reclaim lent quota (or for
                # fair share) once it holds the type's reservation.
                assert reason is not None  # start moved off inf only for a job short of GPUs or of quota
                if not borrow_only and not _any_of(claimed, demand):
                    for t, _ in demand:
                        claimed[t] = True
                    blocked.append(Blocked(job, q, demand, cls, len(waiting), may_reclaim=start is not None))
                elif levels is not None and not borrow_only and len(blocked) < most_preemptors:
                    # not the first of its type: it may make room for priority or by attained service only
                    # (with service levels every blocked job is kept below, so those past the cap never preempt)
                    blocked.append(Blocked(job, q, demand, cls, len(waiting), may_reclaim=False))
                add_waiting(Waiting(job.job_id, reason, i))
                continue
            if reason is None and shadows is not None:
                end = now + job.runtime_limit_s if job.runtime_limit_s is not None else inf
                if not shadows.allows(demand, end):
                    add_waiting(Waiting(job.job_id, RESERVED, i))
                    continue
                shadows.take(demand, end)
            if reason is not None:
                for t, _ in demand:
                    qblock[t] = True
                if reason is not FAIR_SHARE and not borrow_only:
                    assert fail is not None  # every reason but FAIR_SHARE comes with the node that is short
                    level = cls if reason is INSUFFICIENT_GPUS else max(cls, BORROWING)
                    row = reserved[fail[1]]
                    for t, _ in demand:
                        if row[t] > level:
                            row[t] = level
                    blocked.append(Blocked(job, q, demand, cls, len(waiting)))
                add_waiting(Waiting(job.job_id, reason, i))
                continue
            state.take(q, demand, borrow_only)
            checked.clear()
            for t, d in demand:
                free[t] -= d
            admitted.append(Admit(job.job_id))
            room -= 1
            share = shares.update(q)
            if i < n_jobs:
                heappush(heap, (head_class(q, jobs[i]), share, q))
            break
        cursor[q] = i

    # 5. Jobs that blocked look for jobs to preempt.
    preemptions: list[Preemption] = []
    if not noticed:
        # only jobs that could make room now: for priority, or (reservation held) for quota or fair share
        blocked = [
            b
            for b in blocked
            if b.may_reclaim or levels is not None or b.job.priority > lowest.get(b.queue, b.job.priority)
        ]
    if blocked:
        books = (tenancy.preemption, state, shares, free)
        groups = table.groups() if table is not None and kept else group_holders(holders)
        preemptions, preemptors = preempt_or_screen(
            snapshot, now, blocked[:most_preemptors], groups, books, levels, topology, lazy_cluster
        )
        for at in preemptors:
            old = waiting[at]
            waiting[at] = Waiting(old.job_id, PendingReason.PREEMPTING, old.position)

    # 6. Every job left waiting has a reason and a place.
    return AdmissionResult(admitted=admitted, waiting=waiting, preemptions=preemptions)


def _short_of(demand: Demand, free: list[int], root_limit: list[int], root_claim: list[int]) -> bool:
    """Is the gang short of some type among the GPUs free and the root's quota left?"""
    for t, d in demand:  # noqa: SIM110 - a loop: this runs for every waiting job, any() over a generator costs more
        if free[t] < d or root_limit[t] - root_claim[t] < d:
            return True
    return False


def _any_of(flags: list[bool], demand: Demand) -> bool:
    """Is any type of the gang flagged?"""
    for t, _ in demand:  # noqa: SIM110 - a loop, as in _short_of
        if flags[t]:
            return True
    return False


def _admit_fifo(snapshot: AdmissionSnapshot, policy: AdmissionPolicy, now: float) -> AdmissionResult:
    """Admit pending jobs in submission order while their GPU types have room."""
    # 1. Free GPUs per type, from our own copy of the snapshot.
    free = {t: snapshot.capacity.get(t, 0) - snapshot.in_use.get(t, 0) for t in snapshot.capacity}
    blocked: set[str] = set()  # types whose head-of-line job did not fit
    positions: dict[str, int] = {}
    admitted: list[Admit] = []
    waiting: list[Waiting] = []
    # 2. Walk the queue in order; a job fits only if every GPU type it needs fits.
    for job in sorted(snapshot.pending, key=lambda j: (j.order, j.job_id)):
        types = job.gpus_by_type
        position = max((positions.get(t, 0) for t in types), default=0) + 1
        for t in types:
            positions[t] = positions.get(t, 0) + 1
        if job.not_before is not None and job.not_before > now:
            waiting.append(Waiting(job.job_id, BACKOFF, position))  # backoff never holds up the line
            continue
        reason = _blocking_reason(job, snapshot.capacity, free, blocked)
        if reason is None and len(admitted) >= policy.max_admissions_per_cycle:
            reason = PendingReason.QUEUED_BEHIND
        if reason is not None:
            waiting.append(Waiting(job.job_id, reason, position))
            if reason in (PendingReason.INSUFFICIENT_GPUS, PendingReason.QUEUED_BEHIND):
                blocked.update(types)  # jobs that can never run do not hold up the line
            continue
        # 3. Take the GPUs for the whole gang.
        for t, n in types.items():
            free[t] -= n
        admitted.append(Admit(job.job_id))
    return AdmissionResult(admitted=admitted, waiting=waiting)


def _blocking_reason(
    job: PendingJob, capacity: dict[str, int], free: dict[str, int], blocked: set[str]
) -> PendingReason | None:
    for t, n in job.gpus_by_type.items():
        if capacity.get(t, 0) <= 0:
            return PendingReason.NO_CAPACITY_OF_TYPE
        if n > capacity[t]:
            return PendingReason.GANG_LARGER_THAN_CLUSTER
    if any(t in blocked for t in job.gpus_by_type):
        return PendingReason.QUEUED_BEHIND
    if any(n > free.get(t, 0) for t, n in job.gpus_by_type.items()):
        return PendingReason.INSUFFICIENT_GPUS
    return None
