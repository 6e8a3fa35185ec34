"""Which running jobs to stop so that a waiting job can start.

Three ways to make room, tried in this order for each waiting job that
blocked its queue (in the order the cycle met them):

1. **priority** — preemptible jobs of lower priority in the same queue;
2. **reclaim** — when the waiting gang fits its queue's own nominal quota:
   best-effort jobs anywhere, then preemptible jobs of other queues that hold
   more than their nominal quota (they borrowed);
3. **fair share** — preemptible jobs that ran at least the minimum runtime, in
   queues that borrow and whose share stays above the waiting queue's share
   after it starts; the most over-served queues first, and no more than the
   rate limit allows.  Nominal quota is a guarantee: a job inside its queue's
   nominal quota is only ever preempted for priority within its own queue.

Among the candidates of one way, those that lose the least GPU time since
their last checkpoint go first; once the gang fits, victims that turn out not
to be needed are handed back, the costliest first.  Jobs already told to stop
are counted as gone, so a job waiting for them does not preempt again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from trainyard.core.admission.fairshare import FairShare
from trainyard.core.admission.ordering import WITHIN_NOMINAL
from trainyard.core.admission.quota import Demand, QuotaState
from trainyard.core.admission.snapshot import PendingJob, Preemption, RunningJob
from trainyard.core.admission.tree import PreemptionSettings
from trainyard.core.reasons import PreemptionReason


class Holder(NamedTuple):
    job: RunningJob
    queue: int  # node number of its queue
    demand: Demand


class Blocked(NamedTuple):
    job: PendingJob
    queue: int
    demand: Demand
    cls: int  # ordering class when it blocked
    at: int  # index of its entry in the cycle's waiting list


class _Candidate:
    __slots__ = ("holder", "lost_per_gpu", "lost", "ran", "types", "taken")

    def __init__(self, holder: Holder, now: float) -> None:
        job = holder.job
        since = job.started_at if job.last_checkpoint_at is None else max(job.started_at, job.last_checkpoint_at)
        self.holder = holder
        self.lost_per_gpu = max(now - since, 0.0)  # seconds of work lost per GPU if stopped now
        self.lost = self.lost_per_gpu * sum(d for _, d in holder.demand)
        self.ran = now - job.started_at
        self.types = {t for t, _ in holder.demand}
        self.taken = False  # chosen as a victim this cycle


def preempt(
    settings: PreemptionSettings,
    state: QuotaState,
    shares: FairShare,
    free: list[int],
    holders: list[Holder],
    blocked: list[Blocked],
    recent: list[float],
    now: float,
) -> tuple[list[Preemption], list[int]]:
    """Victims for the blocked jobs, and the waiting-list entries now waiting on them."""
    # 1. Jobs already told to stop are as good as gone.
    candidates: list[_Candidate] = []
    for h in holders:
        if h.job.notice_at is not None:
            _release(state, shares, free, h, -1)
        elif h.job.preemptible:
            candidates.append(_Candidate(h, now))
    candidates.sort(key=lambda c: (c.lost_per_gpu, c.holder.job.priority, c.holder.job.job_id))
    by_queue: dict[int, list[_Candidate]] = {}
    for c in candidates:
        by_queue.setdefault(c.holder.queue, []).append(c)
    budget = settings.fair_share_limit - sum(1 for t in recent if now - t < settings.fair_share_window_s)
    preemptions: list[Preemption] = []
    preemptors: list[int] = []
    # 2. Each blocked job in turn: room already coming, or victims by the first way that works.
    for b in blocked:
        borrow_only = b.job.may_only_borrow
        if _fits(state, free, b, borrow_only):
            _take(state, shares, free, b, borrow_only)
            preemptors.append(b.at)
            continue
        victims: list[_Candidate] | None = None
        reason = PreemptionReason.PRIORITY
        if settings.within_queue:
            pool = [c for c in by_queue.get(b.queue, ()) if c.holder.job.priority < b.job.priority]
            victims = _choose(state, shares, free, b, pool, lambda c: True)
        if victims is None and settings.reclaim and b.cls == WITHIN_NOMINAL:
            reason = PreemptionReason.RECLAIM
            pool = [c for q, cs in by_queue.items() if q != b.queue and _over_nominal(state, q) for c in cs]
            pool += [c for q, cs in by_queue.items() if q != b.queue and not _over_nominal(state, q) for c in cs
                     if c.holder.job.may_only_borrow]
            pool.sort(key=lambda c: (not c.holder.job.may_only_borrow, c.lost_per_gpu, c.holder.job.priority,
                                     c.holder.job.job_id))
            victims = _choose(state, shares, free, b, pool, lambda c: _reclaimable(state, c, b.demand))
        if victims is None and settings.fair_share and budget > 0 and not borrow_only:
            reason = PreemptionReason.FAIR_SHARE
            mine = shares.share_with(b.queue, b.demand)
            over = sorted((q for q in by_queue if q != b.queue and shares.share[q] > mine),
                          key=lambda q: (-shares.share[q], q))
            pool = [c for q in over for c in by_queue[q] if c.ran >= settings.min_runtime_s]
            victims = _choose(
                state, shares, free, b, pool,
                lambda c: shares.share[c.holder.queue] > mine and _reclaimable(state, c, b.demand),
            )
            if victims is not None and len(victims) > budget:
                for c in victims:
                    _release(state, shares, free, c.holder, +1)
                victims = None
            elif victims is not None:
                budget -= len(victims)
        if victims is None:
            continue
        # 3. Commit: the victims go, the gang's room is held for it.
        _take(state, shares, free, b, borrow_only)
        preemptors.append(b.at)
        for c in victims:
            c.taken = True
            preemptions.append(
                Preemption(c.holder.job.job_id, b.job.job_id, reason, settings.grace_period_s, c.lost)
            )
    return preemptions, preemptors


def _choose(
    state: QuotaState,
    shares: FairShare,
    free: list[int],
    b: Blocked,
    pool: list[_Candidate],
    still_valid: Callable[[_Candidate], bool],
) -> list[_Candidate] | None:
    """Remove candidates until the gang fits, then hand back the ones not needed."""
    needed = {t for t, _ in b.demand}
    chosen: list[_Candidate] = []
    fits = False
    for c in pool:
        if c.taken or not (c.types & needed) or not still_valid(c):
            continue
        _release(state, shares, free, c.holder, -1)
        chosen.append(c)
        if _fits(state, free, b, b.job.may_only_borrow):
            fits = True
            break
    if not fits:
        for c in chosen:
            _release(state, shares, free, c.holder, +1)
        return None
    for c in sorted(chosen, key=lambda c: -c.lost):
        _release(state, shares, free, c.holder, +1)
        if _fits(state, free, b, b.job.may_only_borrow):
            chosen.remove(c)
        else:
            _release(state, shares, free, c.holder, -1)
    return chosen


def _fits(state: QuotaState, free: list[int], b: Blocked, borrow_only: bool) -> bool:
    return state.check(b.queue, b.demand, borrow_only) is None and all(free[t] >= d for t, d in b.demand)


def _take(state: QuotaState, shares: FairShare, free: list[int], b: Blocked, borrow_only: bool) -> None:
    state.take(b.queue, b.demand, borrow_only)
    for t, d in b.demand:
        free[t] -= d
    shares.update(b.queue)


def _release(state: QuotaState, shares: FairShare, free: list[int], h: Holder, sign: int) -> None:
    """Give back (sign -1) or take again (sign +1) a running job's GPUs."""
    state.take(h.queue, h.demand, h.job.may_only_borrow, sign)
    for t, d in h.demand:
        free[t] -= sign * d
    shares.update(h.queue)


def _over_nominal(state: QuotaState, q: int) -> bool:
    return any(state.borrowing(q, i) for i in range(len(state.index.flavors)))


def _reclaimable(state: QuotaState, c: _Candidate, demand: Demand) -> bool:
    """Best effort, or its queue still holds more than its nominal quota of a type the gang needs."""
    if c.holder.job.may_only_borrow:
        return True
    return any(state.borrowing(c.holder.queue, t) for t, _ in demand if t in c.types)
