"""Admission core benchmark: one cycle over 100,000 pending jobs.

Cluster: 4,096 nodes x 8 GPUs in four GPU types (1,024 nodes each); tenancy:
10 organisations x 10 teams x 10 queues = 1,000 queues in 100 teams, every
queue with quota for two types.  Jobs: 1-64 GPUs, four priority classes (one
of them best effort).  The first cycle starts from an idle cluster; later
cycles carry the admitted jobs as running (with checkpoints, so preemption
has victims to weigh), finish a tenth of them and top the queue back up to
100,000.  Only ``admit`` is timed.

    PYTHONPATH=libs python bench/admission.py [--cycles N] [--pending N]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

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
)

FLAVORS = ["H100", "H200", "A100", "L40S"]
NODES, GPUS_PER_NODE = 4096, 8
ORGS, TEAMS_PER_ORG, QUEUES_PER_TEAM = 10, 10, 10
SIZES = [1, 1, 2, 4, 8, 8, 8, 16, 32, 64]
CLASSES = [(1000, False, False), (500, True, False), (100, True, False), (0, True, True)]  # production..best effort


def build_tenancy() -> tuple[Tenancy, dict[str, int]]:
    per_flavor = NODES // len(FLAVORS) * GPUS_PER_NODE
    capacity = dict.fromkeys(FLAVORS, per_flavor)
    org_q = per_flavor // ORGS
    team_q = org_q // TEAMS_PER_ORG
    queue_q = team_q // QUEUES_PER_TEAM
    cohorts, queues = [], []
    for o in range(ORGS):
        org = f"org{o}"
        cohorts.append(
            Cohort(org, None, {f: FlavorQuota(org_q, lending_limit=org_q // 2) for f in FLAVORS}, 1.0 + o % 3)
        )
        for t in range(TEAMS_PER_ORG):
            team = f"team{o}-{t}"
            cohorts.append(
                Cohort(f"{org}/{team}", org, {f: FlavorQuota(team_q, borrowing_limit=team_q * 4) for f in FLAVORS})
            )
            for q in range(QUEUES_PER_TEAM):
                types = (FLAVORS[q % 4], FLAVORS[(q + 1) % 4])
                quota = {f: FlavorQuota(queue_q, borrowing_limit=queue_q * 8) for f in types}
                queues.append(QueueQuota(team, f"q{q}", f"{org}/{team}", quota, 1.0 + q % 2))
    settings = PreemptionSettings(min_runtime_s=600, grace_period_s=120, fair_share_limit=20, fair_share_window_s=600)
    return Tenancy(queues=queues, cohorts=cohorts, flavors=FLAVORS, preemption=settings), capacity


def new_job(rng: random.Random, n: int, queues: list[QueueQuota], now: float) -> PendingJob:
    queue = rng.choice(queues)
    priority, _, best_effort = rng.choice(CLASSES)
    gpu_type = rng.choice(list(queue.quota))
    return PendingJob(
        job_id=f"job-{n}",
        tenant=queue.tenant,
        queue=queue.name,
        order=n,
        gpus_by_type={gpu_type: rng.choice(SIZES)},
        priority=priority,
        not_before=now + 60 if rng.random() < 0.01 else None,
        may_only_borrow=best_effort,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=8)
    parser.add_argument("--pending", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    tenancy, capacity = build_tenancy()
    policy = AdmissionPolicy(tenancy=tenancy, max_admissions_per_cycle=100_000)
    now = 1_000_000.0
    pending = {f"job-{n}": new_job(rng, n, tenancy.queues, now) for n in range(args.pending)}
    next_id = args.pending
    running: dict[str, RunningJob] = {}
    history: dict[str, dict[str, float]] = {}
    times, decisions, admitted_total, preempted_total = [], 0, 0, 0
    for cycle in range(args.cycles):
        in_use = dict.fromkeys(FLAVORS, 0)
        for r in running.values():
            for t, n in r.gpus_by_type.items():
                in_use[t] += n
        snapshot = AdmissionSnapshot(
            pending=list(pending.values()),
            capacity=capacity,
            in_use=in_use,
            running=list(running.values()),
            usage_history=history,
        )
        result = None  # release the previous result outside the timed region
        start = time.perf_counter()
        result = admit(snapshot, policy, now)
        elapsed = time.perf_counter() - start
        times.append(elapsed)
        made = len(result.admitted) + len(result.waiting)
        decisions += made
        admitted_total += len(result.admitted)
        preempted_total += len(result.preemptions)
        print(
            f"cycle {cycle}: {len(snapshot.pending):>7} pending {len(snapshot.running):>6} running  "
            f"admitted {len(result.admitted):>5}  preemptions {len(result.preemptions):>3}  "
            f"{elapsed * 1000:7.1f} ms  {made / elapsed:>10,.0f} decisions/s"
        )
        # The world moves on: admitted jobs run, a tenth of the running finish, victims stop.
        for a in result.admitted:
            job = pending.pop(a.job_id)
            running[a.job_id] = RunningJob(
                job.job_id,
                job.tenant,
                job.queue,
                job.gpus_by_type,
                started_at=now,
                last_checkpoint_at=now,
                priority=job.priority,
                preemptible=job.priority < 1000,
                may_only_borrow=job.may_only_borrow,
            )
        for p in result.preemptions:
            running.pop(p.job_id, None)
        for job_id in rng.sample(sorted(running), len(running) // 10):
            del running[job_id]
        now += 900.0
        for job_id, r in list(running.items()):
            if rng.random() < 0.5:
                running[job_id] = RunningJob(
                    **{
                        **{f: getattr(r, f) for f in r.__struct_fields__},
                        "last_checkpoint_at": now - rng.uniform(0, 900),
                    }
                )
        usage: dict[str, dict[str, float]] = {}
        for r in running.values():
            per_type = usage.setdefault(f"{r.tenant}/{r.queue}", {})
            for t, n in r.gpus_by_type.items():
                per_type[t] = per_type.get(t, 0.0) + n * 900.0
        history = usage
        while len(pending) < args.pending:
            pending[f"job-{next_id}"] = new_job(rng, next_id, tenancy.queues, now)
            next_id += 1
    ordered = sorted(times)
    p50 = statistics.median(ordered)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    print(
        f"\n{args.cycles} cycles over {args.pending:,} pending jobs, {len(tenancy.queues):,} queues, "
        f"{sum(capacity.values()):,} GPUs in {len(FLAVORS)} types"
    )
    print(f"admission decisions per second: {decisions / sum(times):,.0f}")
    print(f"cycle time p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, max {max(times) * 1000:.0f} ms")
    print(f"admitted {admitted_total:,}, preemption notices {preempted_total:,}")


if __name__ == "__main__":
    main()
