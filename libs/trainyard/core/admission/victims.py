"""Where the GPUs are, for one preemption pass: the topology every commitment is written into, and the
search (placement's ``select_victims``) for whole jobs that free one domain a waiting gang can then use."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from trainyard.core.admission.candidates import Blocked, Candidate, choose, fits, release
from trainyard.core.admission.fairshare import FairShare
from trainyard.core.admission.quota import QuotaState
from trainyard.core.placement.cycle import build_topology
from trainyard.core.placement.gang import fit_gang
from trainyard.core.placement.preemption import select_victims
from trainyard.core.placement.snapshot import ClusterSnapshot, PlacementRequest, RunningAlloc
from trainyard.core.placement.topology import Topology
from trainyard.domain.job import JobSpec
from trainyard.events.jobs import ReplicaPlacement


class VictimSearch:
    """The GPUs' whereabouts for one preemption pass: a topology that every
    commitment is written into (victims' GPUs back, the gang's plan taken)."""

    __slots__ = ("snapshot", "_topo", "_stopping", "specs", "_allocs", "now", "restart_cost_s")

    def __init__(
        self,
        snapshot: ClusterSnapshot,
        specs: Mapping[str, JobSpec],
        now: float,
        restart_cost_s: float,
        topology: Topology | None = None,
    ) -> None:
        self.snapshot = snapshot
        # built on first use, once per pass (select_victims reuses it); or the caller's, which it restores
        self._topo: Topology | None = topology
        self._stopping: list[str] = []  # jobs told to stop before the topology was built
        self.specs = specs
        self._allocs: dict[str, RunningAlloc] | None = None  # made on first use (many passes stop no one)
        self.now = now
        self.restart_cost_s = restart_cost_s

    @property
    def allocs(self) -> dict[str, RunningAlloc]:
        """A job's current run by job id: its whole gang."""
        if self._allocs is None:
            self._allocs = {a.job_id: a for a in self.snapshot.running}
        return self._allocs

    @property
    def topo(self) -> Topology:
        if self._topo is None:
            self._topo = build_topology(self.snapshot)
            for job_id in self._stopping:
                self._give_back(job_id)
        return self._topo

    def stop(self, job_id: str) -> None:
        """A run that is stopping: its GPUs count as free."""
        if self._topo is None:
            self._stopping.append(job_id)
        else:
            self._give_back(job_id)

    def _give_back(self, job_id: str) -> None:
        alloc = self.allocs.get(job_id)
        topo = self.topo
        for r in alloc.replicas if alloc is not None else ():
            node = topo.nodes.get(r.node_id)
            if node is not None:
                topo.give(node, r.gpus)

    def place(self, spec: JobSpec) -> bool:
        """Hold room for the gang on GPUs free now (or freed by this pass), if it fits."""
        return fit_gang(self.topo, spec, self.snapshot.policy.candidates_per_level) is not None

    def commit(self, victims: list[Candidate], plan: list[ReplicaPlacement] | None) -> None:
        for c in victims:
            self.stop(c.holder.job.job_id)
        for r in plan or ():
            node = self.topo.nodes.get(r.node_id)
            if node is not None:
                self.topo.take(node, r.gpus)

    def choose(
        self,
        state: QuotaState,
        shares: FairShare,
        free: list[int],
        b: Blocked,
        spec: JobSpec,
        pool: list[Candidate],
        still_valid: Callable[[Candidate], bool],
    ) -> tuple[list[Candidate] | None, list[ReplicaPlacement] | None]:
        """Whole jobs of ``pool`` that free one domain the gang fits in, plus any more the quota tree needs.

        Released from the quota state when found (as ``_choose`` does); the
        topology is changed only by ``commit``.
        """
        needed = {t for t, _ in b.demand}
        usable = [c for c in pool if not c.taken and c.types & needed and still_valid(c)]
        if not _enough(free, b, usable):
            return None, None  # the gang must fit the free GPUs once its victims stop: these could never do
        by_run: dict[str, tuple[RunningAlloc, Candidate]] = {}
        for c in usable:
            alloc = self.allocs.get(c.holder.job.job_id)
            if alloc is not None:
                by_run[alloc.run_id] = (alloc, c)
        request = PlacementRequest(b.job.job_id, b.job.job_id, spec, 0)
        # 1. The cheapest domain; a victim that stops being valid once others go is dropped and the search rerun.
        while True:
            found = select_victims(
                self.snapshot, request, [a for a, _ in by_run.values()], self.now, self.topo, self.restart_cost_s
            )
            if found is None:
                return None, None
            core: list[Candidate] = []
            invalid = None
            for run_id in found.victims:
                c = by_run[run_id][1]
                if not still_valid(c):
                    invalid = run_id
                    break
                release(state, shares, free, c.holder, -1)
                core.append(c)
            if invalid is None:
                break
            for c in core:
                release(state, shares, free, c.holder, +1)
            del by_run[invalid]
        # 2. The gang fits that domain; the quota tree may need more of the same way's candidates to go.
        if fits(state, free, b, b.job.may_only_borrow):
            return core, found.replicas
        chosen = set(map(id, core))
        extra = choose(state, shares, free, b, [c for c in usable if id(c) not in chosen], still_valid)
        if extra is None:
            for c in core:
                release(state, shares, free, c.holder, +1)
            return None, None
        return core + extra, found.replicas


def _enough(free: list[int], b: Blocked, usable: list[Candidate]) -> bool:
    """Could the gang fit the free GPUs by count if every usable candidate stopped?  Whatever the search
    chooses is some of them, and the gang must then fit by count (``fits``): when even all of them are too
    few, it would find nothing."""
    short = {t: d - free[t] for t, d in b.demand if d > free[t]}
    if not short:
        return True
    for c in usable:
        for t, d in c.holder.demand:
            left = short.get(t)
            if left is not None:
                if left <= d:
                    del short[t]
                    if not short:
                        return True
                else:
                    short[t] = left - d
    return False
