"""Random submit / finish / cycle sequences against random quota trees.

Proves, after every step: quota, borrowing and lending limits are never
exceeded (checked by an independent, plain recount of the tree), no job runs
outside its quota tree, a higher-priority job never waits behind a
lower-priority one of its queue, and no tenant starves: with running work
finishing, every job that could ever run is admitted in a bounded number of
cycles.
"""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from trainyard.core.admission import (
    AdmissionPolicy,
    AdmissionSnapshot,
    Cohort,
    FlavorQuota,
    PendingJob,
    PreemptionSettings,
    QueueQuota,
    RunningJob,
    Tenancy,
    admit,
    check_quota,
    decay_usage_table,
)
from trainyard.core.reasons import PendingReason as R

FLAVORS = ("H100", "A100")
SHAPE = {"o1": {"t1": ["q1", "q2"], "t2": ["q1"]}, "o2": {"t3": ["q1", "q2"]}}
NEVER = {
    R.UNKNOWN_QUEUE,
    R.NO_CAPACITY_OF_TYPE,
    R.GANG_LARGER_THAN_CLUSTER,
    R.GANG_LARGER_THAN_QUOTA,
    R.NO_QUOTA_FOR_TYPE,
}
HOLDS_UP = {R.QUEUED_BEHIND, R.QUOTA, R.COHORT_EXHAUSTED, R.INSUFFICIENT_GPUS, R.FAIR_SHARE, R.PREEMPTING}


def _limits(draw, nominal: int) -> FlavorQuota:
    borrow = draw(st.one_of(st.none(), st.integers(0, 16)))
    lend = draw(st.one_of(st.none(), st.integers(0, nominal)))
    return FlavorQuota(nominal, borrow, lend)


def draw_tree(data) -> Tenancy:
    draw = data.draw
    cohorts, queues = [], []
    for org, teams in SHAPE.items():
        org_total = dict.fromkeys(FLAVORS, 0)
        team_cohorts = []
        for team, names in teams.items():
            team_total = dict.fromkeys(FLAVORS, 0)
            for name in names:
                quota = {}
                for f in FLAVORS:
                    if f == "A100" and draw(st.integers(0, 3)) == 0:
                        continue  # the queue's quota does not list A100: it may not use it
                    nominal = draw(st.integers(0, 16))
                    team_total[f] += nominal
                    quota[f] = _limits(draw, nominal)
                queues.append(QueueQuota(team, name, f"{org}/{team}", quota, draw(st.sampled_from([1.0, 2.0]))))
            quota = {}
            for f in FLAVORS:
                nominal = team_total[f] + draw(st.integers(0, 8))
                org_total[f] += nominal
                quota[f] = _limits(draw, nominal)
            team_cohorts.append(Cohort(f"{org}/{team}", org, quota))
        quota = {f: _limits(draw, org_total[f] + draw(st.integers(0, 8))) for f in FLAVORS}
        cohorts.append(Cohort(org, None, quota, draw(st.sampled_from([1.0, 3.0]))))
        cohorts.extend(team_cohorts)
    preemption = PreemptionSettings(min_runtime_s=draw(st.sampled_from([0.0, 120.0])), fair_share_limit=3)
    return Tenancy(queues=queues, cohorts=cohorts, half_life_s=600.0, preemption=preemption)


def recount(tree: Tenancy, running: list[RunningJob]) -> list[str]:
    """Plain, independent check of every quota limit; returns the violations."""
    nodes = {c.name: c for c in tree.cohorts}
    queues = {(q.tenant, q.name): q for q in tree.queues}
    children: dict[str | None, list] = {}
    for c in tree.cohorts:
        children.setdefault(c.parent, []).append(c)
    for q in tree.queues:
        children.setdefault(q.cohort, []).append(q)
    usage: dict[tuple[str, str], int] = {}
    regular: dict[tuple[str, str], int] = {}
    borrowed: dict[tuple[str, str], int] = {}
    problems = []
    for r in running:
        q = queues.get((r.tenant, r.queue))
        if q is None:
            problems.append(f"{r.job_id} runs in unknown queue {r.tenant}/{r.queue}")
            continue
        for f, n in r.gpus_by_type.items():
            qname = f"{q.tenant}/{q.name}"
            (borrowed if r.may_only_borrow else regular)[(qname, f)] = (borrowed if r.may_only_borrow else regular).get(
                (qname, f), 0
            ) + n
            for name in [qname, *_ancestors(q.cohort, nodes)]:
                usage[(name, f)] = usage.get((name, f), 0) + n

    def name_of(node) -> str:
        return f"{node.tenant}/{node.name}" if isinstance(node, QueueQuota) else node.name

    def kept(node, f) -> int:
        fq = node.quota.get(f)
        if fq is None or fq.lending_limit is None:
            return 0
        return fq.nominal - fq.lending_limit

    def claim(node, f) -> int:
        if isinstance(node, QueueQuota):
            key = (name_of(node), f)
            return max(regular.get(key, 0), kept(node, f)) + borrowed.get(key, 0)
        return max(sum(claim(c, f) for c in children.get(node.name, [])), kept(node, f))

    for node in [*tree.cohorts, *tree.queues]:
        for f in FLAVORS:
            used = usage.get((name_of(node), f), 0)
            fq = node.quota.get(f)
            cap = 0 if fq is None else fq.nominal + (10**9 if fq.borrowing_limit is None else fq.borrowing_limit)
            if used > cap:
                problems.append(f"{name_of(node)} holds {used} {f}, more than nominal plus borrowing {cap}")
    for f in FLAVORS:
        top = children.get(None, [])
        pool = sum(c.quota[f].nominal for c in top if f in c.quota)
        held = sum(claim(c, f) for c in top)
        if held > pool:
            problems.append(f"{f}: usage plus kept-back quota {held} exceeds the tree's {pool}")
    return problems


def _ancestors(name: str | None, nodes: dict) -> list[str]:
    out = []
    while name is not None:
        out.append(name)
        name = nodes[name].parent
    return out


class AdmissionMachine(RuleBasedStateMachine):
    @initialize(data=st.data())
    def setup(self, data):
        self.tree = draw_tree(data)
        self.capacity = {}
        for c in self.tree.cohorts:
            if c.parent is None:
                for f, q in c.quota.items():
                    self.capacity[f] = self.capacity.get(f, 0) + q.nominal
        self.pending: dict[str, PendingJob] = {}
        self.running: dict[str, RunningJob] = {}
        self.ids = itertools.count()
        self.now = 10_000.0
        self.recent: list[float] = []

    @rule(
        q=st.integers(0, 4),
        gpus=st.integers(1, 12),
        flavor=st.sampled_from(FLAVORS),
        priority=st.sampled_from([0, 5, 10]),
        best_effort=st.booleans(),
        backoff=st.booleans(),
    )
    def submit(self, q, gpus, flavor, priority, best_effort, backoff):
        n = next(self.ids)
        queue = self.tree.queues[q]
        self.pending[f"j{n}"] = PendingJob(
            f"j{n}",
            queue.tenant,
            queue.name,
            n,
            {flavor: gpus},
            priority,
            self.now + 30 if backoff and n % 3 == 0 else None,
            best_effort and priority == 0,
        )

    @rule(
        q=st.integers(0, 4),
        sizes=st.lists(st.integers(1, 8), min_size=2, max_size=8),
        priorities=st.lists(st.sampled_from([0, 5, 10]), min_size=8, max_size=8),
        flavor=st.sampled_from(FLAVORS),
    )
    def burst(self, q, sizes, priorities, flavor):
        """Several jobs into one queue at once, so that queues build up."""
        for gpus, priority in zip(sizes, priorities, strict=False):  # 2-8 sizes, 8 priorities: the rest go unused
            self.submit(q, gpus, flavor, priority, False, False)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def finish(self, data):
        job_id = data.draw(st.sampled_from(sorted(self.running)))
        del self.running[job_id]

    @precondition(lambda self: any(r.notice_at is not None for r in self.running.values()))
    @rule()
    def victims_stop(self):
        self.running = {k: r for k, r in self.running.items() if r.notice_at is None}

    @rule()
    def cycle(self):
        self.run_cycle()

    @rule()
    def drain(self):
        """With running work finishing, everything that could ever run starts within a bounded number of cycles."""
        for _ in range(len(self.pending) + 3):
            self.running.clear()
            result = self.run_cycle()
            stuck = [w for w in result.waiting if w.reason not in NEVER]
            if not stuck:
                return
        raise AssertionError(f"jobs starved: {stuck[:5]}")

    def run_cycle(self):
        in_use: dict[str, int] = {}
        for r in self.running.values():
            for f, n in r.gpus_by_type.items():
                in_use[f] = in_use.get(f, 0) + n
        snapshot = AdmissionSnapshot(
            pending=list(self.pending.values()),
            capacity=self.capacity,
            in_use=in_use,
            running=list(self.running.values()),
            recent_preemptions=self.recent,
        )
        result = admit(snapshot, AdmissionPolicy(tenancy=self.tree), self.now)
        decided = [a.job_id for a in result.admitted] + [w.job_id for w in result.waiting]
        assert sorted(decided) == sorted(self.pending), "every pending job gets exactly one decision"
        self.check_priority_order(result)
        for a in result.admitted:
            job = self.pending.pop(a.job_id)
            self.running[a.job_id] = RunningJob(
                job.job_id,
                job.tenant,
                job.queue,
                job.gpus_by_type,
                self.now,
                None,
                job.priority,
                job.priority < 10,
                job.may_only_borrow,
            )
        for p in result.preemptions:
            assert p.job_id in self.running and self.running[p.job_id].preemptible
            assert self.running[p.job_id].notice_at is None, "a job is told to stop once"
            r = self.running[p.job_id]
            self.running[p.job_id] = RunningJob(
                r.job_id,
                r.tenant,
                r.queue,
                r.gpus_by_type,
                r.started_at,
                r.last_checkpoint_at,
                r.priority,
                r.preemptible,
                r.may_only_borrow,
                self.now,
            )
            if p.reason.value == "fair_share":
                self.recent.append(self.now)
        self.now += 60.0
        return result

    def check_priority_order(self, result):
        waiting = {w.job_id: w for w in result.waiting}
        for a in result.admitted:
            job = self.pending[a.job_id]
            for w in waiting.values():
                other = self.pending[w.job_id]
                if (other.tenant, other.queue) != (job.tenant, job.queue) or w.reason not in HOLDS_UP:
                    continue
                if other.gpus_by_type.keys() & job.gpus_by_type.keys():
                    assert (other.priority, -other.order) < (job.priority, -job.order), (
                        f"{w.job_id} (priority {other.priority}) waits ({w.reason}) behind "
                        f"{a.job_id} (priority {job.priority}) in the same queue"
                    )

    @invariant()
    def quota_is_never_exceeded(self):
        running = list(self.running.values())
        assert recount(self.tree, running) == []
        assert check_quota(self.tree, running) == []

    @invariant()
    def gpus_are_never_allocated_twice(self):
        for f, cap in self.capacity.items():
            assert sum(r.gpus_by_type.get(f, 0) for r in self.running.values()) <= cap


AdmissionMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestAdmissionMachine = AdmissionMachine.TestCase


@settings(max_examples=80, deadline=None)
@given(
    capacity=st.integers(8, 48),
    greedy_sizes=st.lists(st.integers(1, 8), min_size=1, max_size=6),
    victim_size=st.integers(1, 48),
    runtime=st.integers(1, 4),
    weights=st.tuples(st.sampled_from([1.0, 2.0, 4.0]), st.sampled_from([1.0, 2.0, 4.0])),
)
def test_no_tenant_starves_under_fair_share(capacity, greedy_sizes, victim_size, runtime, weights):
    """A tenant that keeps submitting cannot hold off another one's job for longer than its runs last."""
    victim_size = min(victim_size, capacity)
    tree = Tenancy(
        queues=[
            QueueQuota("greedy", "q", "org", {"H100": FlavorQuota(0)}, weights[0]),
            QueueQuota("quiet", "q", "org", {"H100": FlavorQuota(0)}, weights[1]),
        ],
        cohorts=[Cohort("org", None, {"H100": FlavorQuota(capacity)})],
        half_life_s=600.0,
        preemption=PreemptionSettings(within_queue=False, reclaim=False, fair_share=False),
    )
    ids = itertools.count()
    pending = {"victim": PendingJob("victim", "quiet", "q", -1, {"H100": victim_size})}
    running: dict[str, tuple[RunningJob, int]] = {}
    history: dict[str, dict[str, float]] = {}
    for c in range(runtime + 3):
        for size in greedy_sizes:
            n = next(ids)
            pending[f"g{n}"] = PendingJob(f"g{n}", "greedy", "q", n, {"H100": size})
        running = {k: (r, end) for k, (r, end) in running.items() if end > c}
        in_use = {"H100": sum(r.gpus_by_type["H100"] for r, _ in running.values())}
        snapshot = AdmissionSnapshot(
            list(pending.values()), {"H100": capacity}, in_use, [r for r, _ in running.values()], history
        )
        result = admit(snapshot, AdmissionPolicy(tenancy=tree), 1000.0 + 60 * c)
        if any(a.job_id == "victim" for a in result.admitted):
            return
        for a in result.admitted:
            job = pending.pop(a.job_id)
            started = RunningJob(a.job_id, job.tenant, job.queue, job.gpus_by_type, 1000.0 + 60 * c)
            running[a.job_id] = (started, c + runtime)
        used: dict[str, dict[str, float]] = {}
        for r, _ in running.values():
            per_type = used.setdefault(f"{r.tenant}/{r.queue}", {"H100": 0.0})
            per_type["H100"] += 60.0 * r.gpus_by_type["H100"]
        history = decay_usage_table(history, used, 60.0, 600.0)
    raise AssertionError(f"the quiet tenant's job of {victim_size} GPUs never started")
