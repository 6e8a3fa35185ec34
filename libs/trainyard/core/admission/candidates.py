"""What a preemption pass weighs: the holders, the jobs that blocked, each candidate victim's cost and
service level, and the quota bookkeeping of taking a victim away or a gang in (preemption.py uses them)."""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import NamedTuple

from trainyard.core.admission.fairshare import FairShare
from trainyard.core.admission.ordering import DemandCache, service_level
from trainyard.core.admission.quota import Demand, QuotaState
from trainyard.core.admission.snapshot import PendingJob, RunningJob
from trainyard.core.admission.tree import Tenancy, TreeIndex


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


class HolderGroups(NamedTuple):
    """The holders as a preemption pass weighs them (the order within a queue does not matter: every pool is
    sorted on keys that end with the job id)."""

    noticed: list[Holder]  # told to stop already: their room is coming
    grouped: dict[int, list[Holder]]  # queue -> its preemptible holders not told to stop: the candidates
    lowest: dict[int, int]  # queue -> lowest priority among its candidates
    lenders: set[int]  # queues with a best-effort candidate (reclaimable wherever it runs)


def group_holders(holders: Iterable[Holder]) -> HolderGroups:
    """The holders by what a preemption pass does with them."""
    noticed: list[Holder] = []
    grouped: dict[int, list[Holder]] = {}
    lowest: dict[int, int] = {}
    lenders: set[int] = set()
    for h in holders:
        job = h.job
        if job.notice_at is not None:
            noticed.append(h)
        elif job.preemptible:
            q = h.queue
            group = grouped.get(q)
            if group is None:
                grouped[q] = [h]
                lowest[q] = job.priority
            else:
                group.append(h)
                if job.priority < lowest[q]:
                    lowest[q] = job.priority
            if job.may_only_borrow:
                lenders.add(q)
    return HolderGroups(noticed, grouped, lowest, lenders)


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


class HolderTable:
    """The running jobs of a caller that decides every cycle over mostly the same runs (the simulator), with
    :func:`load_holders`' sums kept up to date as runs are put and dropped.

    ``holdings()`` equals ``load_holders`` over the runs in the order they were first put (a run put again under
    its key keeps its place, as in a dict) with a :class:`TreeIndex` of the same tenancy and GPU types, without a
    pass over every run each cycle; ``releases()`` equals what backfill's ``Shadows`` would sort from those
    holders.  Give it to ``admit`` with a snapshot whose ``running`` holds the same runs.
    """

    __slots__ = ("tenancy", "flavors", "index", "demands", "_nf", "_all", "held", "usage", "_rows", "_priorities",
                 "_noticed", "_ends", "_holders", "_stopping", "_grouped", "_candidate_priorities", "_lending")  # fmt: skip

    def __init__(self, tenancy: Tenancy, flavors: list[str]) -> None:
        self.tenancy, self.flavors = tenancy, list(flavors)
        self.index = TreeIndex(tenancy, self.flavors)
        self.demands = DemandCache(self.index.fidx)
        self._nf = len(self.index.flavors)
        self._all: dict[Hashable, tuple[RunningJob, Demand, Holder | None]] = {}  # key -> run, demand, holder
        self.held = [0] * self._nf
        self.usage: dict[tuple[int, bool], list[int]] = {}
        self._rows: dict[tuple[int, bool], int] = {}  # usage row -> runs counted in it
        self._priorities: dict[int, dict[int, int]] = {}  # queue -> priority of a preemptible run -> runs
        self._noticed = 0
        self._ends: list[list[tuple[float, int]]] = [[] for _ in range(self._nf)]  # per type: (expected end, GPUs)
        self._holders: dict[Hashable, Holder] = {}  # the runs of known queues, in ``_all``'s order
        # ``group_holders`` kept up to date: holders told to stop, and the candidates by queue
        self._stopping: dict[Hashable, Holder] = {}
        self._grouped: dict[int, dict[Hashable, Holder]] = {}
        self._candidate_priorities: dict[int, dict[int, int]] = {}  # queue -> candidate priority -> runs
        self._lending: dict[int, int] = {}  # queue -> best-effort candidates

    def __len__(self) -> int:
        return len(self._all)

    def serves(self, tenancy: Tenancy, flavors: list[str]) -> bool:
        """Were its queue and type numbers made for this tenancy and these GPU types?"""
        return tenancy is self.tenancy and flavors == self.flavors

    def put(self, key: Hashable, run: RunningJob) -> None:
        """Add a run, or replace the one under ``key`` (it keeps its place)."""
        entry = self._all.get(key)
        if entry is not None:
            old, holding, holder = entry
            if holder is not None and _counted_alike(old, run):  # a new checkpoint, say: no sum changes
                holder = self._holders[key] = Holder(run, holder.queue, holding)
                self._all[key] = (run, holding, holder)
                if run.notice_at is not None:
                    self._stopping[key] = holder
                elif run.preemptible:
                    self._grouped[holder.queue][key] = holder
                return
            self._count(key, *entry, -1)
        holding = self.demands(run.gpus_by_type) or []
        q = self.index.queue_by_pair.get((run.tenant, run.queue))
        holder = None if q is None else Holder(run, q, holding)
        self._all[key] = (run, holding, holder)
        if holder is None:
            self._holders.pop(key, None)
        elif entry is None or key in self._holders:
            self._holders[key] = holder  # a new run goes last; a run put again keeps its place
        else:  # put again, now in a known queue: its place among the others
            self._holders = {k: h for k, (_, _, h) in self._all.items() if h is not None}
        self._count(key, run, holding, holder, 1)

    def drop(self, key: Hashable) -> None:
        """Forget the run under ``key`` (nothing when there is none)."""
        entry = self._all.pop(key, None)
        if entry is not None:
            self._holders.pop(key, None)
            self._count(key, *entry, -1)

    def _count(self, key: Hashable, run: RunningJob, holding: Demand, holder: Holder | None, sign: int) -> None:
        held = self.held
        for i, d in holding:
            held[i] += sign * d
        if holder is None:
            return
        q = holder.queue
        row_key = (q, run.may_only_borrow)
        row = self.usage.get(row_key)
        if row is None:
            row = self.usage[row_key] = [0] * self._nf
        end = math.inf if run.expected_end is None else run.expected_end
        for i, d in holding:
            row[i] += sign * d
            ends = self._ends[i]
            if sign > 0:
                insort(ends, (end, d))
            else:
                del ends[bisect_left(ends, (end, d))]
        left = self._rows[row_key] = self._rows.get(row_key, 0) + sign
        if not left:  # no run counted in it: gone, as load_holders would not make it
            del self._rows[row_key], self.usage[row_key]
        if run.preemptible:
            _count_priority(self._priorities, q, run.priority, sign)
        if run.notice_at is not None:
            self._noticed += sign
        self._group(key, holder, sign)

    def _group(self, key: Hashable, holder: Holder, sign: int) -> None:
        run, q = holder.job, holder.queue
        if run.notice_at is not None:
            if sign > 0:
                self._stopping[key] = holder
            else:
                del self._stopping[key]
            return
        if not run.preemptible:
            return
        if sign > 0:
            self._grouped.setdefault(q, {})[key] = holder
        else:
            group = self._grouped[q]
            del group[key]
            if not group:
                del self._grouped[q]
        _count_priority(self._candidate_priorities, q, run.priority, sign)
        if run.may_only_borrow:
            left = self._lending[q] = self._lending.get(q, 0) + sign
            if not left:
                del self._lending[q]

    def groups(self) -> HolderGroups:
        """What :func:`group_holders` would make of ``holdings().holders`` (the order within a queue may differ)."""
        return HolderGroups(
            list(self._stopping.values()),
            {q: list(group.values()) for q, group in self._grouped.items()},
            {q: min(counts) for q, counts in self._candidate_priorities.items()},
            set(self._lending),
        )

    def holdings(self) -> Holdings:
        """What :func:`load_holders` would read from the runs held now (shared lists: read them only)."""
        lowest = {q: min(counts) for q, counts in self._priorities.items()}
        holders = list(self._holders.values())
        return Holdings(holders, self.held, self.usage, lowest, self._noticed > 0)

    def releases(self) -> list[list[tuple[float, int]]]:
        """Per type, when the holders' GPUs come back, earliest first (``Shadows.releases``; shared: read only)."""
        return self._ends


def _count_priority(counts: dict[int, dict[int, int]], q: int, priority: int, sign: int) -> None:
    """One more (sign 1) or one fewer (-1) run of ``priority`` in queue ``q``; empty entries are dropped."""
    of_queue = counts.setdefault(q, {})
    n = of_queue[priority] = of_queue.get(priority, 0) + sign
    if not n:
        del of_queue[priority]
        if not of_queue:
            del counts[q]


def _counted_alike(old: RunningJob, new: RunningJob) -> bool:
    """Do the two runs add the same to every sum and group of a :class:`HolderTable`?"""
    return (
        old.tenant == new.tenant
        and old.queue == new.queue
        and old.gpus_by_type == new.gpus_by_type
        and old.may_only_borrow == new.may_only_borrow
        and old.preemptible == new.preemptible
        and old.priority == new.priority
        and (old.notice_at is None) == (new.notice_at is None)
        and old.expected_end == new.expected_end
    )


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
