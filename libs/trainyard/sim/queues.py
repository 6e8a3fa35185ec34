"""The simulator's pending jobs, per queue, in exactly the order the admission core sorts them.

The core sorts a queue by priority, then (least-attained-service order) the
service level of the job's earlier runs, then its order key; a job that has
waited longer than ``starvation_s`` moves ahead of every level (the same rank,
-1, whatever its level, as ``ordering.group_pending`` gives it), so admission
takes each queue as given (``AdmissionSnapshot.pending_in_order``).  Keeping each queue sorted
by that key here lets a cycle hand admission only the jobs that could matter
(:meth:`PendingQueues.candidates`) instead of every pending job.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable
from heapq import heappop, heappush

from trainyard.core.admission.ordering import level_bounds, service_level
from trainyard.core.admission.tree import Scheduling

Key = tuple[int, int, int, int]  # (-priority, service level, order, job index)

#: How far past the first job that does not fit a cycle looks for jobs to backfill.
BACKFILL_SCAN = 256


class PendingQueues:
    """Sorted pending lists per queue; mutated by the simulator only."""

    def __init__(self, queues: list[str], scheduling: Scheduling, types: Iterable[str] = ()) -> None:
        self.lists: dict[str, list[Key]] = {q: [] for q in queues}
        self.types = set(types)  # every GPU type a job may ask for (empty: not known, never stop a scan early)
        self.where: dict[int, tuple[str, Key]] = {}  # job index -> its queue and key
        self.las = scheduling.order == "las"
        self.levels = level_bounds(scheduling)
        self.starvation_s = scheduling.starvation_s
        self.starving: list[tuple[float, int]] = []  # (submitted, job index) of jobs not starved yet

    def __len__(self) -> int:
        return len(self.where)

    def level(self, attained_gpu_s: float) -> int:
        return service_level(self.levels, attained_gpu_s) if self.las else 0

    def add(
        self, queue: str, i: int, priority: int, order: int, attained_gpu_s: float, submitted: float, now: float
    ) -> None:
        level = self.level(attained_gpu_s)
        if self.las:
            if submitted < now - self.starvation_s:  # starved: as the core ranks it (ordering.group_pending)
                level = -1
            else:
                heappush(self.starving, (submitted, i))
        key = (-priority, level, order, i)
        pend = self.lists[queue]
        if not pend or pend[-1] < key:
            pend.append(key)
        else:
            insort(pend, key)
        self.where[i] = (queue, key)

    def remove(self, i: int) -> None:
        queue, key = self.where.pop(i)
        pend = self.lists[queue]
        del pend[bisect_left(pend, key)]

    def promote(self, now: float) -> None:
        """Jobs that have waited longer than ``starvation_s`` go ahead of every service level."""
        starved_before = now - self.starvation_s
        while self.starving and self.starving[0][0] < starved_before:
            _, i = heappop(self.starving)
            found = self.where.get(i)
            if found is None or found[1][1] < 0:
                continue
            queue, (neg, _, order, _) = found
            self.remove(i)
            key = (neg, -1, order, i)
            insort(self.lists[queue], key)
            self.where[i] = (queue, key)

    def replace(self, queue: str, keys: list[Key]) -> None:
        """A new order for one queue (policies that recompute priorities every cycle)."""
        self.lists[queue] = keys
        for key in keys:
            self.where[key[3]] = (queue, key)

    def candidates(
        self, queue: str, demand_of: list[tuple[str, int]], free: dict[str, int], backfill: bool
    ) -> list[Key]:
        """The jobs of ``queue`` admission could act on now, in order.

        ``demand_of[i]`` is job i's (GPU type, GPUs).  Every job up to the
        first whose cumulative demand of its type exceeds the free GPUs of that
        type (later jobs of the type would wait behind it); with backfill, also
        later jobs that fit in the free GPUs on their own, up to
        :data:`BACKFILL_SCAN` of them.
        """
        keys = self.lists[queue]
        out: list[Key] = []
        want: dict[str, int] = {}
        blocked: set[str] = set()  # types whose cumulative demand passed the free GPUs
        scanned = 0  # jobs looked at since the first type blocked
        for n, key in enumerate(keys):
            if blocked:
                scanned += 1
                if scanned > BACKFILL_SCAN:
                    break
            t, gpus = demand_of[key[3]]
            if t in blocked:
                if backfill and gpus <= free.get(t, 0):
                    out.append(key)
                continue
            out.append(key)
            want[t] = want.get(t, 0) + gpus
            if want[t] > free.get(t, 0):
                blocked.add(t)
                if self.types and blocked >= self.types:
                    # every type is blocked: the rest of the scan keeps only the jobs that fit the free GPUs
                    if backfill:
                        rest = keys[n + 1 : n + 1 + BACKFILL_SCAN - scanned]
                        out += [k for k in rest if (d := demand_of[k[3]])[1] <= free.get(d[0], 0)]
                    break
        return out
