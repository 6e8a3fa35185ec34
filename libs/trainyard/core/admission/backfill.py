"""EASY backfill in admission: later jobs start now only if they do not delay the first blocked one.

When a job cannot start because too few GPUs of a type are free, the cycle
gives it a *shadow reservation* on that type (the first such job per type,
as in EASY backfill): from the running jobs' expected ends (their start plus
the user's run-time limit; a run without a limit may end at any moment) it
finds the earliest time ``start`` at which
enough GPUs will be free for it, and how many GPUs beyond its need will be
free then (``spare``).  A later job, of any queue, may then take free GPUs of
that type now if it will end before ``start`` by its own limit, or if it fits
in ``spare`` (which it then uses up).  Jobs without a limit can only use
``spare``.  Nothing else holds the line: a blocked job no longer stops every
later job of its queue, so small jobs flow around large gangs while the
largest waiting gang still starts no later than it would have.  A job the
running jobs' ends would never make room for (nodes missing, quota kept back
for others) gets no reservation and holds up its queue as without backfill.

Expected ends come from run-time limits, which users overstate: runs end
early, GPUs come free sooner, and the reserved job starts sooner than
planned, never later (unless nodes fail).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from trainyard.core.admission.quota import Demand

if TYPE_CHECKING:
    from trainyard.core.admission.candidates import Holder


class Shadow:
    """One type's reservation: when the blocked job starts, and GPUs spare then."""

    __slots__ = ("job_id", "start", "spare")

    def __init__(self, job_id: str, start: float, spare: int) -> None:
        self.job_id = job_id
        self.start = start  # expected start of the reserved job (inf: not while nodes are missing)
        self.spare = spare  # GPUs free at ``start`` beyond what it needs: later long jobs may use them


class Shadows:
    """The per-type reservations of one admission cycle; mutated by that cycle only."""

    __slots__ = ("_releases", "holders", "by_type", "now")

    def __init__(
        self,
        type_count: int,
        holders: Sequence[Holder],
        now: float,
        releases: list[list[tuple[float, int]]] | None = None,
    ) -> None:
        self.holders = holders  # the jobs holding GPUs; their expected ends are read on the first reservation
        # ``releases`` already sorted from those holders by a caller that keeps them (``HolderTable``)
        self._releases = releases
        self.by_type: list[Shadow | None] = [None] * type_count
        self.now = now

    @property
    def releases(self) -> list[list[tuple[float, int]]]:
        """When held GPUs come back, per type, earliest first (a run without a limit: never known)."""
        if self._releases is None:
            per_type: list[list[tuple[float, int]]] = [[] for _ in self.by_type]
            inf = math.inf
            for h in self.holders:
                end = h.job.expected_end
                if end is None:
                    end = inf
                for t, d in h.demand:
                    per_type[t].append((end, d))
            for ends in per_type:
                ends.sort()  # (expected end, GPUs)
            self._releases = per_type
        return self._releases

    def reserve(self, job_id: str, demand: Demand, free: list[int]) -> float | None:
        """Reserve every type of ``demand`` that has no reservation yet; the job's expected start.

        None when earlier jobs hold the reservations of all its types: it
        waits, and later jobs may still start around the reservations.
        ``inf`` when the running jobs' ends would never make room for it
        (nodes are missing, or quota kept back for others is in the way):
        it then holds up its queue as without backfill.
        """
        shadows = [(t, self._shadow(job_id, t, d, free[t])) for t, d in demand if self.by_type[t] is None]
        if not shadows:
            return None
        start = max(s.start for _, s in shadows)
        if start < math.inf:
            for t, shadow in shadows:
                self.by_type[t] = shadow
        return start

    def _shadow(self, job_id: str, t: int, need: int, free: int) -> Shadow:
        avail = free
        if avail >= need:
            return Shadow(job_id, self.now, avail - need)
        releases = self.releases[t]
        for k, (end, gpus) in enumerate(releases):
            avail += gpus
            # every release at the same moment counts before the job starts
            if avail >= need and (k + 1 == len(releases) or releases[k + 1][0] > end):
                if end == math.inf:
                    # it waits for runs without a limit, which may end at any moment: hold everything free
                    return Shadow(job_id, self.now, 0)
                return Shadow(job_id, max(end, self.now), avail - need)
        return Shadow(job_id, math.inf, 0)  # running jobs alone will never make room

    def holds_all(self, demand: Demand) -> bool:
        """Do earlier jobs hold the reservations of every type of ``demand`` (so :meth:`reserve` gives None)?"""
        by_type = self.by_type
        for t, _ in demand:  # noqa: SIM110 - a loop: called for every job short of GPUs
            if by_type[t] is None:
                return False
        return True

    def allows(self, demand: Demand, end: float) -> bool:
        """Would a job of ``demand`` that runs until ``end`` at the latest leave every reservation intact?"""
        for t, d in demand:
            shadow = self.by_type[t]
            if shadow is not None and end > shadow.start and d > shadow.spare:
                return False
        return True

    def take(self, demand: Demand, end: float) -> None:
        """A job that passed :meth:`allows` starts: it uses spare GPUs if it outlives a reservation."""
        for t, d in demand:
            shadow = self.by_type[t]
            if shadow is not None and end > shadow.start:
                shadow.spare -= d

    def any(self) -> bool:
        return any(s is not None for s in self.by_type)
