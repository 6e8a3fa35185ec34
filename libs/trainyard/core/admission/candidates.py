"""What a preemption pass weighs: the holders, the jobs that blocked, each candidate victim's cost and
service level, and the quota bookkeeping of taking a victim away or a gang in (preemption.py uses them)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from trainyard.core.admission.fairshare import FairShare
from trainyard.core.admission.ordering import DemandCache, service_level
from trainyard.core.admission.quota import Demand, QuotaState
from trainyard.core.admission.snapshot import PendingJob, RunningJob
from trainyard.core.admission.tree import TreeIndex


class Holder(NamedTuple):
    job: RunningJob
    queue: int  # node number of its queue
    demand: Demand


class Holdings(NamedTuple):
    """What the running jobs hold, read once per cycle."""

    holders: list[Holder]  # running jobs of known queues, in snapshot order
    held: list[int]  # GPUs held per type, every running job counted
    usage: dict[tuple[int, bool], list[int]]  # (queue, borrow-only) -> GPUs held per type
    lowest: dict[int, int]  # queue -> lowest priority of a preemptible holder (priority preemption)
    noticed: bool  # a holder was already told to stop: its room is coming for someone


def load_holders(running: Sequence[RunningJob], index: TreeIndex, demands: DemandCache) -> Holdings:
    """The holders of one cycle and their sums (one pass; this runs for every holder in every cycle)."""
    nf = len(index.flavors)
    held = [0] * nf
    holders: list[Holder] = []
    usage: dict[tuple[int, bool], list[int]] = {}
    lowest: dict[int, int] = {}
    noticed = False
    queue_by_pair = index.queue_by_pair
    nothing: Demand = []
    add = holders.append
    rows: dict[tuple[str, str, bool], tuple[int, list[int]] | None] = {}  # (tenant, queue, borrow-only) -> usage
    for r in running:
        holding = demands(r.gpus_by_type) or nothing
        for i, d in holding:
            held[i] += d
        key = (r.tenant, r.queue, r.may_only_borrow)
        if key in rows:
            where = rows[key]
        else:
            q = queue_by_pair.get((r.tenant, r.queue))
            where = rows[key] = None if q is None else (q, usage.setdefault((q, r.may_only_borrow), [0] * nf))
        if where is None:
            continue  # a queue the tree does not know: its GPUs are held, but it is no candidate
        q, row = where
        for i, d in holding:
            row[i] += d
        add(Holder(r, q, holding))
        if r.preemptible:
            p = r.priority
            if p < lowest.get(q, p + 1):
                lowest[q] = p
        if r.notice_at is not None:
            noticed = True
    return Holdings(holders, held, usage, lowest, noticed)


class Blocked(NamedTuple):
    job: PendingJob
    queue: int
    demand: Demand
    cls: int  # ordering class when it blocked
    at: int  # index of its entry in the cycle's waiting list
    # it may also reclaim lent quota and preempt for fair share (with backfill: once it holds a reservation,
    # that is once it has waited; priority preemption never waits)
    may_reclaim: bool = True


class Candidate:
    __slots__ = ("holder", "lost_per_gpu", "lost", "cost", "ran", "types", "taken", "level")

    def __init__(
        self, holder: Holder, now: float, restart_cost_s: float, levels: Sequence[float] | None, types: set[int]
    ) -> None:
        job = holder.job
        since = job.started_at if job.last_checkpoint_at is None else max(job.started_at, job.last_checkpoint_at)
        gpus = 0
        for _, d in holder.demand:
            gpus += d
        self.holder = holder
        self.lost_per_gpu = max(now - since, 0.0)  # seconds of work lost per GPU if stopped now
        self.lost = self.lost_per_gpu * gpus
        self.cost = (self.lost_per_gpu + restart_cost_s) * gpus  # lost work plus getting back to it
        self.ran = now - job.started_at
        self.types = types  # the GPU types it holds (shared between candidates of one demand)
        self.taken = False  # chosen as a victim this cycle
        # service level reached so far, this run included (least attained service; 0 when off)
        self.level = 0 if levels is None else service_level(levels, job.attained_gpu_s + max(self.ran, 0.0) * gpus)


def choose(
    state: QuotaState,
    shares: FairShare,
    free: list[int],
    b: Blocked,
    pool: list[Candidate],
    still_valid: Callable[[Candidate], bool],
) -> list[Candidate] | None:
    """Remove candidates until the gang fits, then hand back the ones not needed."""
    needed = {t for t, _ in b.demand}
    chosen: list[Candidate] = []
    made_room = False
    for c in pool:
        if c.taken or not (c.types & needed) or not still_valid(c):
            continue
        release(state, shares, free, c.holder, -1)
        chosen.append(c)
        if fits(state, free, b, b.job.may_only_borrow):
            made_room = True
            break
    if not made_room:
        for c in chosen:
            release(state, shares, free, c.holder, +1)
        return None
    for c in sorted(chosen, key=lambda c: -c.cost):
        release(state, shares, free, c.holder, +1)
        if fits(state, free, b, b.job.may_only_borrow):
            chosen.remove(c)
        else:
            release(state, shares, free, c.holder, -1)
    return chosen


def fits(state: QuotaState, free: list[int], b: Blocked, borrow_only: bool) -> bool:
    return state.check(b.queue, b.demand, borrow_only) is None and all(free[t] >= d for t, d in b.demand)


def take(state: QuotaState, shares: FairShare, free: list[int], b: Blocked, borrow_only: bool) -> None:
    state.take(b.queue, b.demand, borrow_only)
    for t, d in b.demand:
        free[t] -= d
    shares.update(b.queue)


def release(state: QuotaState, shares: FairShare, free: list[int], h: Holder, sign: int) -> None:
    """Give back (sign -1) or take again (sign +1) a running job's GPUs."""
    state.take(h.queue, h.demand, h.job.may_only_borrow, sign)
    for t, d in h.demand:
        free[t] -= sign * d
    shares.update(h.queue)


def over_nominal(state: QuotaState, q: int) -> bool:
    return any(state.borrowing(q, i) for i in range(len(state.index.flavors)))


def reclaimable(state: QuotaState, c: Candidate, demand: Demand) -> bool:
    """Best effort, or its queue still holds more than its nominal quota of a type the gang needs."""
    if c.holder.job.may_only_borrow:
        return True
    return any(state.borrowing(c.holder.queue, t) for t, _ in demand if t in c.types)
