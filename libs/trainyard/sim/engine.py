"""The discrete-event loop: a virtual clock over arrivals, completions, failures and scheduling ticks.

Every scheduling decision comes from the core: ``admit`` (admission,
trainyard.core.admission) and the placement cycle behind ``place``
(trainyard.core.placement), fed with the snapshots a service would build.  The
loop emits the services' event types (JobAccepted, JobAdmitted, JobPlaced,
RunStarted, RunSucceeded, RunFailed), so ``check_job_log`` can verify a run.

A cycle runs at most once per ``tick_s`` of virtual time, and only after
something changed (a job arrived or ended, a node failed or came back); with
``tick_s = 0`` it runs at the very moment of the change.  Admission sees, per
queue, only the jobs up to the first one that could not fit in the free GPUs:
the later ones would wait behind it anyway.
"""

from __future__ import annotations

import gc
import math
from heapq import heappop, heappush

from msgspec.structs import replace

from trainyard.core.admission import AdmissionPolicy, HolderTable, RunningJob, queue_key
from trainyard.core.admission.tree import TreeIndex
from trainyard.core.lifecycle import HEAD_OF_QUEUE_OFFSET, JobRecord, JobTable
from trainyard.core.placement import RunningAlloc
from trainyard.domain.job import ValidationError
from trainyard.events.jobs import CheckpointSaved, JobAccepted, JobRejected, RunFailed, RunSucceeded
from trainyard.sim.cluster import SimCluster
from trainyard.sim.failures import FailureSource, progress_lost
from trainyard.sim.fairness import FairPeriod
from trainyard.sim.policies import Policy, first_order
from trainyard.sim.queues import PendingQueues
from trainyard.sim.scheduling import ReleaseOrder, SchedulingCycle
from trainyard.sim.state import ARRIVE, CHECKPOINT, DETECT, FAIL, FINISH, REPAIR, STOP, TICK, JobState, Scenario
from trainyard.sim.tenancy import tenancy_for
from trainyard.sim.views import AdmissionView, Samples
from trainyard.sim.workloads import GPU_TYPE, QUEUE, Workload

#: Allocations between collections of the youngest generation while a simulation runs (the default is 700).
GC_YOUNG_OBJECTS = 20_000

__all__ = [
    "ARRIVE",
    "CHECKPOINT",
    "DETECT",
    "FAIL",
    "FINISH",
    "REPAIR",
    "STOP",
    "TICK",
    "Scenario",
    "Simulator",
    "simulate",
]


class Simulator(AdmissionView, Samples, SchedulingCycle):
    def __init__(
        self, workload: Workload, cluster: SimCluster, policy: Policy, scenario: Scenario = Scenario()
    ) -> None:
        self.workload, self.cluster, self.policy, self.scenario = workload, cluster, policy, scenario
        types = cluster.capacity_by_type
        several_queues = any(len(qs) > 1 or qs != [QUEUE] for qs in workload.queues.values())
        tenancy = tenancy_for(
            workload.quotas,
            borrowing=scenario.borrowing,
            preemption=policy.preemption,
            fair_share_preemption=policy.fair_share_preemption,
            min_runtime_s=policy.min_runtime_s,
            service_preemption=policy.service_preemption,
            service_min_runtime_s=policy.service_min_runtime_s,
            capacity=dict(types) if list(types) != [GPU_TYPE] else None,
            queues=workload.queues if several_queues else None,
        )
        self.tenancy = replace(tenancy, scheduling=policy.scheduling)
        classes = {c.name: c for c in self.tenancy.priority_classes}
        self.priority = [
            classes[j.priority_class].priority if j.priority_class in classes else 0 for j in workload.jobs
        ]
        self.preemptible = [
            classes[j.priority_class].preemptible if j.priority_class in classes else True for j in workload.jobs
        ]
        self.only_borrow = [
            classes[j.priority_class].may_only_borrow if j.priority_class in classes else False for j in workload.jobs
        ]  # best effort: runs only on capacity others lend
        self.demand_of = [(j.gpu_type, j.gpus) for j in workload.jobs]  # (GPU type, GPUs) of each job
        requests: dict[tuple[str, int], dict[str, int]] = {}  # one dict per distinct request, shared, never changed
        self.request_of = [requests.setdefault(d, {d[0]: d[1]}) for d in self.demand_of]  # each job's GPUs by type
        self.qkey = [queue_key(j.tenant, j.queue) for j in workload.jobs]  # "tenant/queue" of each job
        self.admission = AdmissionPolicy(tenancy=self.tenancy)
        index = TreeIndex(self.tenancy, list(types))
        # largest gang each queue could ever get, per type
        self.ceiling = {
            (index.names[q], t): index.ceiling[q][f] for q in index.queue_nodes for t, f in index.fidx.items()
        }
        self.entitled = dict.fromkeys(workload.quotas, 0.0)  # tenant -> its share of the cluster by weights
        for q in index.queue_nodes:
            self.entitled[index.names[q].split("/")[0]] += index.entitlement[q]
        self.jobs = [JobState(j, first_order(policy, j.index, j.duration)) for j in workload.jobs]
        queues = sorted(set(self.qkey) | set(index.queue_of))
        self.pending = PendingQueues(queues, policy.scheduling, {t for t, _ in self.demand_of})
        self.to_place: dict[int, int] = {}  # admitted, not yet placed: job -> admission sequence
        self.admitted_running: dict[int, RunningJob] = {}  # admission's view of holders
        self.holder_table = HolderTable(self.tenancy, list(types))  # the same holders, summed as they change
        self.allocs: dict[int, RunningAlloc] = {}  # placement's view of holders
        self.releases = ReleaseOrder()  # the same, by when their GPUs come back at the latest
        self.on_node: dict[str, set[int]] = {n: set() for n in cluster.order}
        self.in_use: dict[str, int] = dict.fromkeys(types, 0)  # GPUs per type held by admitted and placed jobs
        self.held_q: dict[tuple[str, str], int] = {}  # (queue, type) -> GPUs placed (fair-share usage)
        self.used_q: dict[tuple[str, str], float] = {}  # (queue, type) -> GPU-seconds placed
        self.held_by: dict[str, int] = dict.fromkeys(workload.quotas, 0)  # tenant -> GPUs placed
        self.history: dict[str, dict[str, float]] = {}  # queue -> type -> decayed GPU-seconds
        self.hist_at = 0.0  # when the history was last decayed
        self.hist_used: dict[tuple[str, str], float] = {}  # used_q at that time
        self.used_s: dict[str, float] = dict.fromkeys(workload.quotas, 0.0)  # GPU-seconds placed per tenant
        self.recent_preemptions: list[float] = []
        self.preempting = False  # the last cycle's admission preempted (the next one decides with the cluster)
        self.events: list = []
        self.table = JobTable()  # the lifecycle fold over every event the simulation emits
        self.log_seq = 0  # sequence of the last event on the simulated log
        self.heap: list[tuple[float, int, int, int, object]] = []
        self.seq = 0
        self.now = 0.0
        self.last = 0.0  # time of the last accounting step
        self.tick_at: float | None = None
        self.cycles = 0
        self.admit_seq = 0
        self.requeues = 0
        self.left = len(self.jobs)  # jobs not yet done or rejected
        self.busy_s = 0.0  # GPU-seconds held by placed runs
        self.up_s = 0.0  # GPU-seconds of nodes in service
        self.timeline: list[tuple[float, float, int, int, int]] = []  # (t, utilisation, pending, running, down)
        self.fragmentation: list[tuple[float, dict[str, float]]] = []
        self.jain_samples: list[float] = []  # Jain's index of held vs fair GPUs, at samples with contention
        self.fair_periods: dict[int, FairPeriod] = {}  # the same samples summed per FAIR_PERIOD_S (report.py)
        self.violations: list[str] = []
        self.decisions: list[
            tuple
        ] = []  # ("admit", snapshot, now, result) / ("place", snapshot, requests, now, result)
        self.failure_log: list[tuple[float, str, str]] = []  # (t, node, cause)
        self.failures = FailureSource(scenario.failures, cluster.order, scenario.seed)

    # --- the loop ---

    def push(self, at: float, kind: int, what: object) -> None:
        self.seq += 1
        heappush(self.heap, (at, kind, self.seq, kind, what))

    def emit(self, event: object) -> JobRecord | None:
        """Put an event on the simulated log: the lifecycle fold applies it, as the live projection does."""
        if self.scenario.record_events:
            self.events.append(event)
        self.log_seq += 1
        self.table.apply(event, self.log_seq)  # type: ignore[arg-type]
        return self.table.jobs.get(event.job_id)  # type: ignore[attr-defined]

    def run(self) -> Simulator:
        # Each cycle allocates thousands of short-lived objects while the job table only grows: with the default
        # thresholds the collector rescans that table hundreds of times (15 % of a deeply queued run's time).
        thresholds = gc.get_threshold()
        gc.set_threshold(GC_YOUNG_OBJECTS, *thresholds[1:])
        try:
            return self._run()
        finally:
            gc.set_threshold(*thresholds)

    def _run(self) -> Simulator:
        for i, j in enumerate(self.workload.jobs):
            self.push(j.submit, ARRIVE, i)
        for node in self.cluster.order:
            at = self.failures.next_failure(node, 0.0)
            if at is not None:
                self.push(at, FAIL, node)
        horizon = self.scenario.horizon_s if self.scenario.horizon_s is not None else math.inf
        next_sample = 0.0
        frag_every = self._frag_every()
        next_frag = 0.0
        handlers = (self._arrive, self._finish, self._fail, self._detect, self._stop, self._repair, self._checkpoint)
        while self.heap and self.left > 0:
            at, kind, _, _, what = heappop(self.heap)
            if at > horizon:
                break
            self._advance(at)
            while next_sample <= at:
                self._sample(next_sample)
                next_sample += self.scenario.sample_s
            if kind == TICK:
                self.tick_at = None
                self.cycle()
                if at >= next_frag and frag_every:
                    self._sample_fragmentation()
                    next_frag = at + frag_every
                continue
            handlers[kind](what)
            if kind == CHECKPOINT:
                continue  # it changes what stopping the run would lose, not what can run: no cycle of its own
            if self.tick_at is None:
                tick = self.scenario.tick_s
                self.tick_at = at if tick <= 0 else max(at, math.ceil(at / tick) * tick)
                self.push(self.tick_at, TICK, None)
        self._advance(self.now)
        return self

    def _advance(self, at: float) -> None:
        dt = at - self.last
        if dt > 0:
            placed = 0
            for tenant, gpus in self.held_by.items():
                if gpus:
                    self.used_s[tenant] += gpus * dt
                    placed += gpus
            used_q = self.used_q
            for key, gpus in self.held_q.items():
                if gpus:
                    used_q[key] = used_q.get(key, 0.0) + gpus * dt
            self.busy_s += placed * dt
            self.up_s += self.cluster.up_gpus * dt
            self.last = at
        self.now = at

    # --- event handlers ---

    def _arrive(self, i: int) -> None:
        """Accepted, or rejected at once when its queue could never hold the gang (as admission does live)."""
        st = self.jobs[i]
        job = st.job
        qkey = self.qkey[i]
        ceiling = min(self.ceiling.get((qkey, job.gpu_type), 0), self.cluster.capacity_by_type.get(job.gpu_type, 0))
        if job.gpus > ceiling:
            st.status = "rejected"
            self.left -= 1
            self.emit(
                JobRejected(
                    at=self.now,
                    job_id=job.job_id,
                    tenant=job.tenant,
                    errors=[
                        ValidationError(
                            "roles",
                            f"the gang needs {job.gpus} {job.gpu_type} GPUs but queue {qkey} can get at most {ceiling}",
                        )
                    ],
                )
            )
            return
        record = self.emit(JobAccepted(at=self.now, job_id=job.job_id, spec=self._spec(st), submitted_at=job.submit))
        st.order = self._order(i, record.order)
        self._enqueue(i)

    def _enqueue(self, i: int) -> None:
        st = self.jobs[i]
        st.status = "pending"
        self.pending.add(self.qkey[i], i, self._queue_priority(i), st.order, st.attained, st.job.submit, self.now)

    def _finish(self, what: tuple[int, str, bool]) -> None:
        i, run_id, timed_out = what
        st = self.jobs[i]
        if st.run_id != run_id or st.status != "running" or st.failed_at is not None:
            return  # an old run, or one whose node already failed
        if timed_out:
            self._interrupt(i, "timeout", self.now, None)  # stopped at its run-time limit, as live
            return
        self._release(i)
        st.status, st.end, st.remaining = "done", self.now, 0.0
        self.left -= 1
        self.emit(RunSucceeded(at=self.now, job_id=st.job.job_id, tenant=st.job.tenant, run_id=run_id))

    def _fail(self, node: str) -> None:
        cause, repair_s = self.failures.cause()
        self.failure_log.append((self.now, node, cause))
        self.cluster.fail(node)
        for i in sorted(self.on_node[node]):
            st = self.jobs[i]
            if st.failed_at is None and st.status == "running":
                st.failed_at = self.now
                self.push(self.now + self.scenario.failures.detection_s, DETECT, (i, st.run_id, node))
        # back in service only after its runs were noticed failed and gave their GPUs up
        self.push(self.now + max(repair_s, self.scenario.failures.detection_s), REPAIR, node)

    def _detect(self, what: tuple[int, str, str]) -> None:
        i, run_id, node = what
        st = self.jobs[i]
        if st.run_id != run_id or st.status != "running":
            return
        self._interrupt(i, "node_failure", st.failed_at, node)
        st.failures += 1

    def _stop(self, what: tuple[int, str]) -> None:
        i, run_id = what
        st = self.jobs[i]
        if st.run_id != run_id or st.status not in ("admitted", "running"):
            return
        self._interrupt(i, "preempted", self.now, None)
        st.preemptions += 1

    def _checkpoint(self, what: tuple[int, str, int]) -> None:
        """The run saved its ``k``-th checkpoint (``CheckpointSaved`` on the log, as a node agent reports
        it): admission now prices stopping it by the work since then, as it does live."""
        i, run_id, k = what
        st = self.jobs[i]
        if st.run_id != run_id or st.status != "running" or st.failed_at is not None:
            return  # an old run, or one whose node already failed
        job = st.job
        done = job.duration - st.remaining + (self.now - st.placed_at - st.overhead)  # seconds of work saved
        self.emit(CheckpointSaved(at=self.now, job_id=job.job_id, tenant=job.tenant, run_id=run_id, step=int(done)))
        if st.running is not None:
            self.hold(i, replace(st.running, last_checkpoint_at=self.now))
        if st.alloc is not None:  # the run as the topology-aware victim search prices it
            st.alloc = self.allocs[i] = replace(st.alloc, last_checkpoint_at=self.now)
        self.schedule_checkpoint(i, k + 1)

    def schedule_checkpoint(self, i: int, k: int = 1) -> None:
        """The current run's ``k``-th periodic checkpoint, if it comes before the run ends: one every
        ``checkpoint_interval_s`` of useful work, counted from the end of its restart overhead (what
        ``progress_lost`` keeps when a run is interrupted)."""
        interval = self.scenario.failures.checkpoint_interval_s
        if interval <= 0:
            return
        st = self.jobs[i]
        at = st.placed_at + st.overhead + k * interval
        if at < st.placed_at + min(st.overhead + st.remaining, st.job.limit_s):
            self.push(at, CHECKPOINT, (i, st.run_id, k))

    def _repair(self, node: str) -> None:
        self.cluster.repair(node)
        at = self.failures.next_failure(node, self.now)
        if at is not None:
            self.push(at, FAIL, node)

    def _interrupt(self, i: int, reason: str, stopped_at: float, node: str | None) -> None:
        """End the current run early: keep the work up to its last checkpoint, then requeue as the fold says."""
        st = self.jobs[i]
        model = self.scenario.failures
        # 1. Work saved and lost.
        if st.status == "running":
            ran = stopped_at - st.placed_at - st.overhead
            interval = 0.0 if reason == "preempted" and model.checkpoint_on_notice else model.checkpoint_interval_s
            saved, lost = progress_lost(min(ran, st.remaining), interval)
            st.remaining -= saved
            wasted = lost + (self.now - stopped_at) + min(max(stopped_at - st.placed_at, 0.0), st.overhead)
            st.gpus_lost += wasted * st.job.gpus
            if reason == "preempted":
                # what stopping it costs: the work since its checkpoint and the restart its next run pays
                restart = model.restart_overhead_s * st.job.gpus
                st.gpus_lost += restart
                st.lost_to_preemption += wasted * st.job.gpus + restart
        # 2. Its GPUs back, the failure on the log.
        self._release(i)
        record = self.emit(
            RunFailed(
                at=self.now, job_id=st.job.job_id, tenant=st.job.tenant, run_id=st.run_id, reason=reason, node_id=node
            )
        )  # type: ignore[arg-type]
        # 3. Requeued (or failed for good) by the lifecycle fold's rules: its place, its backoff, its retries.
        if record.status == "failed":
            st.status, st.end = "failed", self.now
            self.left -= 1
            return
        self.requeues += 1
        st.order = self._order(i, record.order)
        st.not_before = record.not_before
        st.attained = record.attained_gpu_s
        if st.not_before is not None and st.not_before > self.now:
            self.push(st.not_before, TICK, None)  # a cycle when its backoff is over, even if nothing else happens
        self._enqueue(i)

    def _order(self, i: int, log_order: int) -> int:
        """A job's key inside its queue: the fold's (submission order, moved to the head after a node failure),
        or the policy's own first-attempt key moved the same way."""
        if self.policy.order_by != "duration":
            return log_order
        key = first_order(self.policy, i, self.jobs[i].job.duration)
        return key - HEAD_OF_QUEUE_OFFSET if log_order < 0 else key

    def _release(self, i: int) -> None:
        st = self.jobs[i]
        self.to_place.pop(i, None)
        if self.admitted_running.pop(i, None) is not None:
            self.holder_table.drop(i)
            self.in_use[st.job.gpu_type] -= st.job.gpus
        alloc = self.allocs.pop(i, None)
        self.releases.drop(i)
        if alloc is not None:
            self.cluster.release(alloc.replicas)
            self.held_by[st.job.tenant] -= st.job.gpus
            self.held_q[(self.qkey[i], st.job.gpu_type)] -= st.job.gpus
            for r in alloc.replicas:
                self.on_node[r.node_id].discard(i)
        st.alloc, st.running, st.failed_at = None, None, None

    def _spec(self, st: JobState):
        if st.spec is None:
            st.spec = st.job.spec()
        return st.spec


def simulate(workload: Workload, cluster: SimCluster, policy: Policy, scenario: Scenario = Scenario()) -> Simulator:
    return Simulator(workload, cluster, policy, scenario).run()
