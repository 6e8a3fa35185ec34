"""Reservations for blocked gangs, and backfill that never delays them (EASY).

When a gang cannot start, the cycle asks when it could: running jobs end at
the latest at ``started_at + max_runtime_s``, so their GPUs come back in a
known order.  The earliest time at which the gang fits, and the GPUs it would
get then, form its reservation.  A later job may still start now if it ends
before the reservation begins, or if it keeps off the reserved GPUs; both
leave every reserved GPU free at the reservation's start.

Reservations after the first treat earlier reservations' GPUs as never free,
which is conservative: a second reservation can never delay the first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from trainyard.core.placement.gang import fit_gang, undo
from trainyard.core.placement.probe import Probe
from trainyard.core.placement.snapshot import Reservation, RunningAlloc
from trainyard.core.placement.topology import Node, Topology
from trainyard.domain.job import JobSpec
from trainyard.events.jobs import ReplicaPlacement

Given = list[tuple[Node, list[int]]]  # nodes that got GPUs back, with their free GPUs before: restored on undo
Release = tuple[float, list[ReplicaPlacement]]  # a holder's (latest end, replicas)


def _end(release: Release) -> float:
    return release[0]


class Backfill:
    """The reservations of one cycle and the masks that keep later jobs off them."""

    def __init__(
        self, topo: Topology, now: float, running: list[RunningAlloc], releases: Sequence[Release] | None = None
    ) -> None:
        self.topo = topo
        self.now = now
        # The holders, read for their (latest end, replicas) only when a reservation is searched for (most
        # cycles search for none), and the gangs placed in this cycle.  ``releases``: the same, earliest end
        # first (equal ends in the order of ``running``), kept by a caller from cycle to cycle.
        self.running = running
        self.releases = releases
        self.added: list[Release] = []
        self.reservations: list[Reservation] = []
        self.reserved: list[dict[str, list[int]]] = []  # per reservation: node id -> GPUs
        self.reserved_gpus: set[tuple[str, int]] = set()  # union over reservations
        self.masked: list[tuple[Node, list[int]]] = []  # free GPUs taken out of the tree by the mask
        self.mask_set: tuple[int, ...] = ()  # indices of the reservations currently masked

    def add_release(self, end: float, replicas: list[ReplicaPlacement]) -> None:
        self.added.append((end, replicas))

    # --- masks ---

    def mask_for(self, end: float) -> None:
        """Keep a job that runs until ``end`` off every reservation that begins before it ends."""
        self.set_mask([i for i, r in enumerate(self.reservations) if r.start_at < end])

    def set_mask(self, which: list[int]) -> None:
        if tuple(which) == self.mask_set:
            return
        self.unmask()
        for i in which:
            for node_id, gpus in self.reserved[i].items():
                node = self.topo.nodes[node_id]
                taken = self.topo.take(node, gpus)
                if taken:
                    self.masked.append((node, taken))
        self.mask_set = tuple(which)

    def unmask(self) -> None:
        for node, gpus in reversed(self.masked):
            self.topo.give(node, gpus)
        self.masked = []
        self.mask_set = ()

    # --- reservations ---

    def reserve(
        self, job_id: str, run_id: str, spec: JobSpec, limit: int, probe: Probe | None = None
    ) -> Reservation | None:
        """Find when and where the gang first fits as running jobs end; ``None`` if never.

        Holders are released in order of their ends.  Whether the gang fits after
        the first ``k`` releases only grows with ``k``.  Where the aggregates
        answer exactly (one GPU type, one replica size, no per-role constraint)
        the releases are handed back one at a time, each checked against the
        domains above the nodes it frees; otherwise the search gallops (1, 2,
        4, ... releases) and then bisects, packing the gang to try.  The
        reservation starts when the last released holder ends, by which time
        every released GPU is free.  ``probe``: the gang's ``Probe`` on this
        tree, if the caller has it.
        """
        self.set_mask(list(range(len(self.reservations))))
        groups = self._releases()  # earliest first
        applied: list[Given] = []

        def goto(k: int) -> None:
            while len(applied) < k:
                applied.append(self._apply(groups[len(applied)][1]))
            while len(applied) > k:
                for node, before in reversed(applied.pop()):
                    self.topo.reset(node, before)

        def fits_at(k: int) -> bool:  # for gangs the aggregates cannot answer: pack to know
            goto(k)
            got = fit_gang(self.topo, spec, limit)
            if got is not None:
                undo(self.topo, [(0, "", self.topo.nodes[r.node_id], r.gpus) for r in got])
            return got is not None

        n = len(groups)
        if probe is None:
            probe = Probe(self.topo, spec)
        if probe.exact:
            # The aggregates answer exactly: hand the releases back one at a time and look only at the
            # domains above the nodes each one frees, instead of galloping back and forth over the tree.
            if probe.never or n == 0:
                return None
            hi = 1 if probe.now() else n + 1  # the earliest start is the first release
            while hi > n and len(applied) < n:
                given = self._apply(groups[len(applied)][1])
                applied.append(given)
                if probe.after(node for node, _ in given):
                    hi = len(applied)
            if hi > n:
                goto(0)
                return None
            return self._reserve_at(job_id, run_id, spec, limit, groups, hi, goto)
        lo, hi, k = 0, 0, 1
        while k <= n:  # gallop: 1, 2, 4, ... groups of releases
            if fits_at(k):
                hi = k
                break
            lo, k = k, k * 2
        if hi == 0:
            if lo >= n or not fits_at(n):
                goto(0)
                return None
            hi = n
        while hi - lo > 1:  # binary search for the earliest group that makes room
            mid = (lo + hi) // 2
            if fits_at(mid):
                hi = mid
            else:
                lo = mid
        return self._reserve_at(job_id, run_id, spec, limit, groups, hi, goto)

    def _releases(self) -> Sequence[Release]:
        """Every holder's and every gang placed in this cycle's (end, replicas), earliest first; equal
        ends in the order of ``running``, then of placement."""
        if self.releases is None:
            return sorted([(a.expected_end, a.replicas) for a in self.running] + self.added, key=_end)
        if not self.added:
            return self.releases
        return sorted([*self.releases, *self.added], key=_end)

    def _reserve_at(
        self,
        job_id: str,
        run_id: str,
        spec: JobSpec,
        limit: int,
        groups: Sequence[Release],
        hi: int,
        goto: Callable[[int], None],
    ) -> Reservation | None:
        """The reservation once the first ``hi`` releases make room; the tree is left as it came."""
        goto(hi)
        plan = fit_gang(self.topo, spec, limit)
        if plan is not None:
            undo(self.topo, [(0, "", self.topo.nodes[r.node_id], r.gpus) for r in plan])
        goto(0)
        if plan is None:
            return None
        start_at = max(groups[hi - 1][0], self.now)
        reservation = Reservation(job_id=job_id, run_id=run_id, start_at=start_at, replicas=plan)
        self._hold(reservation)
        return reservation

    def _hold(self, reservation: Reservation) -> None:
        by_node: dict[str, list[int]] = {}
        for r in reservation.replicas:
            by_node.setdefault(r.node_id, []).extend(r.gpus)
            self.reserved_gpus.update((r.node_id, g) for g in r.gpus)
        self.reservations.append(reservation)
        self.reserved.append(by_node)
        self.set_mask(list(range(len(self.reservations))))

    def _apply(self, replicas: list[ReplicaPlacement]) -> Given:
        """Hand one holder's GPUs back to the tree, except those already reserved."""
        given: Given = []
        reserved = self.reserved_gpus
        for r in replicas:
            node = self.topo.nodes.get(r.node_id)
            if node is None:
                continue
            gpus = [g for g in r.gpus if (r.node_id, g) not in reserved] if reserved else r.gpus
            before = node.free_gpus
            if self.topo.give(node, gpus):
                given.append((node, before))
        return given
