"""One scheduling cycle of the simulator: admission, then placement, through
the same core the services call, and what their decisions change.

A mixin of :class:`trainyard.sim.engine.Simulator`, as the views are; it reads
and updates the simulator's state and puts the runs' ends and preemptions on
its event heap.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Mapping

from msgspec.structs import replace

from trainyard.core.admission import AdmissionSnapshot, RunningJob, admit
from trainyard.core.placement import ClusterSnapshot, PlacementRequest, RunningAlloc
from trainyard.core.placement.backfill import Release
from trainyard.domain.job import JobSpec
from trainyard.events.jobs import JobAdmitted, JobPlaced, RunStarted
from trainyard.sim.checks import check_order, check_state
from trainyard.sim.placing import place_live
from trainyard.sim.state import FINISH, STOP


class SchedulingCycle:
    """Admit, then place, the way the admission and placement services do."""

    def cycle(self) -> None:
        self.cycles += 1
        now = self.now
        self._decay_history()
        # 1. Admission: the jobs that could fit, the holders, the capacity in service.
        snapshot = self._admission_snapshot()
        every = self.scenario.check_every
        checking = bool(every) and self.cycles % every == 0
        if checking and self.admission.tenancy is not None:
            self.violations.extend(check_order(snapshot, self.admission.tenancy.scheduling, now))
        # the preemption pass searches the live tree (and restores it) rather than building one, while it is the
        # tree a snapshot would give: a failed node is in the live tree, with no GPU free, but in no snapshot's
        topology = None if self.cluster.down else self.cluster.topo
        if self.preempting and snapshot.pending and self.allocs:
            # the last cycle preempted (under load, preemption by attained service is frequent): decide with the
            # cluster at once
            snapshot = self._with_cluster(snapshot, topology is not None)
            result = admit(snapshot, self.admission, now, self.holder_table, topology)
        else:
            # victims are chosen on the topology, as the live service does, but the cluster is built only if
            # choosing them by GPU counts would preempt (admit then decides on it)
            with_cluster: list[AdmissionSnapshot] = []

            def cluster() -> tuple[ClusterSnapshot, dict[str, JobSpec]]:
                full = self._with_cluster(snapshot, topology is not None)
                with_cluster.append(full)
                assert full.cluster is not None
                return full.cluster, full.specs

            result = admit(snapshot, self.admission, now, self.holder_table, topology, cluster)
            if with_cluster:
                snapshot = with_cluster[0]
        self.preempting = bool(result.preemptions)
        if self.scenario.trace_decisions:
            self.decisions.append(("admit", snapshot, now, result))
        for a in result.admitted:
            self._admitted(int(a.job_id[1:]))
        for p in result.preemptions:
            i = int(p.job_id[1:])
            st = self.jobs[i]
            if p.reason.value == "fair_share":
                self.recent_preemptions.append(now)
            if st.running is not None:
                self.hold(i, replace(st.running, notice_at=now))
            self.push(now + p.grace_period_s, STOP, (i, st.run_id))
        # 2. Placement: every admitted gang not yet placed, in admission order, on the live tree.
        if self.to_place:
            requests = [
                PlacementRequest(
                    job_id=self.jobs[i].job.job_id, run_id=self.jobs[i].run_id, spec=self._spec(self.jobs[i]), order=seq
                )
                for i, seq in self.to_place.items()
            ]
            running = list(self.allocs.values())
            before = self.cluster.snapshot(running, self.policy.placement) if self.scenario.trace_decisions else None
            placed = place_live(self.cluster, running, self.policy.placement, requests, now, self.releases.items)
            if before is not None:
                self.decisions.append(("place", before, requests, now, placed))
            for p in placed.placements:
                self._placed(int(p.job_id[1:]), p)
        # 3. Invariants.
        if checking:
            self.violations.extend(check_state(self))

    def _with_cluster(self, snapshot: AdmissionSnapshot, live_tree: bool) -> AdmissionSnapshot:
        """The snapshot with the cluster and the pending jobs' specs: victims are chosen on the topology.

        With ``live_tree`` admission is given the live tree, so the nodes are left out of the snapshot (it costs
        O(nodes)) unless decisions are traced, which must replay as direct calls of the core."""
        running = list(self.allocs.values())
        if live_tree and not self.scenario.trace_decisions:
            cluster = ClusterSnapshot(nodes=[], running=running, policy=self.policy.placement)
        else:
            cluster = self.cluster.snapshot(running, self.policy.placement)
        if self.scenario.trace_decisions:  # replayed as a direct call of the core: the specs as a service has them
            specs: Mapping[str, JobSpec] = {
                p.job_id: self._spec(self.jobs[int(p.job_id[1:])]) for p in snapshot.pending
            }
        else:
            specs = SpecsById(self)  # read only for the few jobs that look for victims
        return replace(snapshot, cluster=cluster, specs=specs)

    def _admitted(self, i: int) -> None:
        st = self.jobs[i]
        job = st.job
        self.pending.remove(i)
        st.attempt += 1
        st.status = "admitted"
        st.run_id = f"{job.job_id}.{st.attempt}"
        self.hold(
            i,
            RunningJob(
                job_id=job.job_id,
                tenant=job.tenant,
                queue=job.queue,
                gpus_by_type=self.request_of[i],
                started_at=self.now,
                priority=self.priority[i],
                preemptible=self.preemptible[i],
                may_only_borrow=self.only_borrow[i],
                expected_end=self.now + job.limit_s,
                attained_gpu_s=st.attained,
            ),
        )
        self.in_use[job.gpu_type] += job.gpus
        self.admit_seq += 1
        self.to_place[i] = self.admit_seq
        self.emit(JobAdmitted(at=self.now, job_id=job.job_id, tenant=job.tenant, run_id=st.run_id, attempt=st.attempt))

    def hold(self, i: int, running: RunningJob) -> None:
        """Job ``i``'s run as admission sees it, new or changed: kept on the job, among the holders and in
        the holder table."""
        self.jobs[i].running = self.admitted_running[i] = running
        self.holder_table.put(i, running)

    def _placed(self, i: int, p) -> None:
        st = self.jobs[i]
        job = st.job
        del self.to_place[i]
        st.status = "running"
        st.placed_at = self.now
        st.overhead = self.scenario.failures.restart_overhead_s if st.attempt > 1 else 0.0
        if st.first_start is None:
            st.first_start = self.now
        st.alloc = RunningAlloc(
            job_id=job.job_id,
            run_id=st.run_id,
            replicas=p.replicas,
            started_at=self.now,
            max_runtime_s=job.limit_s,
            preemptible=self.preemptible[i],
            priority=self.priority[i],
        )
        self.allocs[i] = st.alloc
        self.releases.add(i, st.alloc)
        self.held_by[job.tenant] += job.gpus
        key = (self.qkey[i], job.gpu_type)
        self.held_q[key] = self.held_q.get(key, 0) + job.gpus
        for r in p.replicas:
            self.on_node[r.node_id].add(i)
        self.emit(
            JobPlaced(
                at=self.now, job_id=job.job_id, tenant=job.tenant, run_id=st.run_id, cluster="sim", replicas=p.replicas
            )
        )
        self.emit(RunStarted(at=self.now, job_id=job.job_id, tenant=job.tenant, run_id=st.run_id))
        run_for = st.overhead + st.remaining
        if run_for > job.limit_s:
            self.push(self.now + job.limit_s, FINISH, (i, st.run_id, True))
        else:
            self.push(self.now + run_for, FINISH, (i, st.run_id, False))
        self.schedule_checkpoint(i)


class ReleaseOrder:
    """Placement's holders as (latest end, replicas), earliest end first and equal ends in the order the
    runs started: what ``Backfill`` would sort from the holders for every reservation it searches for,
    kept as runs start and end instead."""

    __slots__ = ("items", "_keys", "_key_of", "_started")

    def __init__(self) -> None:
        self.items: list[Release] = []
        self._keys: list[tuple[float, int]] = []  # (end, start number), beside items
        self._key_of: dict[int, tuple[float, int]] = {}
        self._started = 0

    def add(self, i: int, alloc: RunningAlloc) -> None:
        self.drop(i)
        key = self._key_of[i] = (alloc.expected_end, self._started)
        self._started += 1
        at = bisect_left(self._keys, key)
        self._keys.insert(at, key)
        self.items.insert(at, (alloc.expected_end, alloc.replicas))

    def drop(self, i: int) -> None:
        key = self._key_of.pop(i, None)
        if key is not None:
            at = bisect_left(self._keys, key)
            del self._keys[at], self.items[at]


class SpecsById(Mapping[str, JobSpec]):
    """The simulator's jobs' specs by job id (``j<number>``), made when first read."""

    __slots__ = ("sim",)

    def __init__(self, sim: SchedulingCycle) -> None:
        self.sim = sim

    def __getitem__(self, job_id: str) -> JobSpec:
        number = int(job_id[1:]) if job_id[1:].isdigit() else -1
        if not 0 <= number < len(self.sim.jobs):
            raise KeyError(job_id)
        return self.sim._spec(self.sim.jobs[number])

    def __iter__(self) -> Iterator[str]:
        return (st.job.job_id for st in self.sim.jobs)

    def __len__(self) -> int:
        return len(self.sim.jobs)
