"""What the simulator shows the admission core each cycle, and what it samples for the report.

Mixins of :class:`trainyard.sim.engine.Simulator`; they read and update its state.
"""

from __future__ import annotations

import math

from trainyard.core.admission import AdmissionSnapshot, PendingJob, decay_usage
from trainyard.core.placement import fragmentation
from trainyard.sim.fairness import FAIR_PERIOD_S, FairPeriod, jain, water_fill
from trainyard.sim.policies import multifactor

#: A multifactor score above any the factors give: a job moved to the head of its queue after a node failure.
HEAD_OF_QUEUE_SCORE = 10**9


class AdmissionView:
    """The admission snapshot a service would build, and the decayed usage behind fair share."""

    def _admission_snapshot(self) -> AdmissionSnapshot:
        up = self.cluster.up_by_type()
        free = {t: up[t] - self.in_use[t] for t in up}
        pending: list[PendingJob] = []
        multi = self.policy.order_by == "multifactor"
        backfill = self.policy.scheduling.backfill
        queues = self.pending
        queues.promote(self.now)
        jobs = self.jobs
        if multi and self.now >= self._priority_calc_at:
            # Slurm recomputes every pending job's priority once per PriorityCalcPeriod, not every pass
            self._priority_calc_at = self.now + self.policy.priority_calc_s
            for qkey, queue in queues.lists.items():
                self._reprioritise(qkey, queue)
        for qkey, queue in queues.lists.items():
            if not queue:
                continue
            for key in queues.candidates(qkey, self.demand_of, free, backfill):
                st = jobs[key[3]]
                shown = st.shown  # the same job as last cycle unless it has another key
                if shown is None or shown[0] is not key:
                    i = key[3]
                    job = st.job
                    shown = st.shown = (
                        key,
                        PendingJob(
                            job_id=job.job_id,
                            tenant=job.tenant,
                            queue=job.queue,
                            order=key[2],
                            gpus_by_type=self.request_of[i],
                            priority=-key[0],
                            not_before=st.not_before,
                            may_only_borrow=self.only_borrow[i],
                            runtime_limit_s=job.limit_s,
                            attained_gpu_s=st.attained,
                            submitted_at=job.submit,
                        ),
                    )
                pending.append(shown[1])
        self.recent_preemptions = [t for t in self.recent_preemptions if self.now - t < 3600.0]
        return AdmissionSnapshot(
            pending=pending,
            capacity=up,
            in_use=dict(self.in_use),
            running=list(self.admitted_running.values()),
            usage_history=self.history,
            recent_preemptions=self.recent_preemptions,
            pending_in_order=True,  # each queue's list is kept in the core's order (queues.py)
        )

    _priority_calc_at = -math.inf  # when a multifactor policy next recomputes every pending job's priority

    def _queue_priority(self, i: int) -> int:
        """The priority a job (re)joins its queue with: its class's, or for a multifactor policy its score now
        (Slurm scores a job when it is submitted, then once per PriorityCalcPeriod)."""
        if self.policy.order_by != "multifactor":
            return self.priority[i]
        return self._score(i, self.jobs[i].order, self._share(self.qkey[i].split("/")[0]))

    def _score(self, i: int, order: int, share: float) -> int:
        """Job i's multifactor score, its tenant's fair share ``share``; first of all after a node failure."""
        if order < 0:
            return HEAD_OF_QUEUE_SCORE
        job = self.jobs[i].job
        return multifactor(self.policy, self.now - job.submit, share, job.gpus, self.cluster.capacity)

    def _reprioritise(self, qkey: str, queue: list) -> None:
        if not queue:
            return
        share = self._share(qkey.split("/")[0])
        keys = []
        for old in queue:
            _, _, order, i = old
            key = (-self._score(i, order, share), 0, order, i)
            keys.append(old if key == old else key)  # an unchanged key stays the same object (views check it)
        keys.sort()
        self.pending.replace(qkey, keys)

    def _share(self, tenant: str) -> float:
        prefix = tenant + "/"
        hist = sum(v for q, per_type in self.history.items() if q.startswith(prefix) for v in per_type.values())
        recent = hist * math.log(2) / self.tenancy.half_life_s
        return recent / max(self.entitled[tenant] * self.cluster.capacity, 1e-9)

    def _decay_history(self) -> None:
        elapsed = self.now - self.hist_at
        if elapsed <= 0:
            return
        half = self.tenancy.half_life_s
        last = self.hist_used
        out = {}
        for (qkey, gpu_type), total in self.used_q.items():
            used = total - last.get((qkey, gpu_type), 0.0)
            prev = self.history.get(qkey, {}).get(gpu_type, 0.0)
            if used or prev:
                out.setdefault(qkey, {})[gpu_type] = decay_usage(prev, used, elapsed, half)
        self.history = out
        self.hist_at, self.hist_used = self.now, dict(self.used_q)


class Samples:
    """Utilisation, fairness and fragmentation samples for the report."""

    def _sample(self, t: float) -> None:
        up = self.cluster.up_gpus
        placed = sum(self.held_by.values())
        pending = len(self.pending)
        self.timeline.append((t, placed / up if up else 0.0, pending, len(self.allocs), len(self.cluster.down)))
        if placed and pending:
            # fairness now: GPUs held against the weighted max-min split of them, capped by what each tenant wants
            wanted = {}
            for tenant, held in self.held_by.items():
                wanted[tenant] = held
            for queue in self.pending.lists.values():
                for *_, i in queue:
                    wanted[self.jobs[i].job.tenant] += self.jobs[i].job.gpus
            fair = water_fill(wanted, self.entitled, placed)
            ratios = [self.held_by[t] / f for t, f in fair.items() if f > 0]
            self.jain_samples.append(jain(ratios))
            period = self.fair_periods.get(int(t // FAIR_PERIOD_S))
            if period is None:
                period = self.fair_periods[int(t // FAIR_PERIOD_S)] = FairPeriod({}, {})
            period.add(self.held_by, wanted, placed)

    def _frag_every(self) -> float:
        jobs = self.workload.jobs
        if not jobs or self.scenario.fragmentation_samples <= 0:
            return 0.0
        span = jobs[-1].submit - jobs[0].submit
        return max(span / self.scenario.fragmentation_samples, 1.0)

    def _sample_fragmentation(self) -> None:
        snap = self.cluster.snapshot([], self.policy.placement)
        self.fragmentation.append((self.now, fragmentation(snap)))
