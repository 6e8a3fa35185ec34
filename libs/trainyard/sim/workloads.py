"""Workloads for the simulator: the Philly trace and seeded synthetic mixes.

A workload is a list of :class:`SimJob` (sorted by submission time) and the
quota tree (:class:`Tenancy`) its tenants run under.  Every tenant is a team
with one queue, ``default``.

Philly (Jeon et al., ATC'19; trace CC BY 4.0, msr-fiddle/philly-traces) comes
from ``philly/philly_jobs_adaptdl.csv`` as copied from petuum/adaptdl
(osdi21-artifact branch); each virtual cluster (VC) is a tenant whose nominal
quota is its size in ``philly/philly_vc_nodes.csv`` (HeliosArtifact, MIT): 8-GPU
nodes per VC.  Jobs larger than 8 GPUs become gangs of 8-GPU replicas (plus one
smaller replica for a remainder).
"""

from __future__ import annotations

import csv
import math
import os
import random
from datetime import datetime, timezone
from pathlib import Path

from trainyard.core.admission import Cohort, FlavorQuota, PreemptionSettings, PriorityClass, QueueQuota, Tenancy
from trainyard.domain.job import MAX_RUNTIME_S, JobSpec, Role

GPU_TYPE = "H100"
QUEUE = "default"


class SimJob:
    """One submitted job: its gang shape, when it arrives and how much work it is."""

    __slots__ = ("index", "job_id", "tenant", "submit", "duration", "roles", "gpus", "limit_s", "priority_class")

    def __init__(
        self, index: int, tenant: str, submit: float, duration: float, roles: tuple[tuple[str, int, int], ...],
        limit_s: int | None = None, priority_class: str = "standard",
    ) -> None:
        self.index = index  # position in submission order
        self.job_id = f"j{index:07d}"
        self.tenant = tenant
        self.submit = submit  # seconds of virtual time
        self.duration = max(float(duration), 1.0)  # seconds of work on a healthy gang
        self.roles = roles  # (role name, replicas, GPUs per replica)
        self.gpus = sum(r * g for _, r, g in roles)
        # the run-time limit the user asked for; backfill plans with it
        self.limit_s = limit_s if limit_s is not None else estimate_limit(self.duration)
        self.priority_class = priority_class

    def spec(self) -> JobSpec:
        roles = [Role(name=n, replicas=r, gpus_per_replica=g, gpu_type=GPU_TYPE) for n, r, g in self.roles]
        return JobSpec(
            tenant=self.tenant, queue=QUEUE, roles=roles, priority_class=self.priority_class,
            max_runtime_s=self.limit_s, simulated_duration_s=min(self.duration, float(self.limit_s)),
        )

    def __repr__(self) -> str:
        return f"SimJob({self.job_id}, {self.tenant}, {self.gpus} GPUs, t={self.submit}, d={self.duration})"


def estimate_limit(duration: float, factor: float = 2.0) -> int:
    """A user's run-time limit: twice the real run time, rounded up to the hour."""
    hours = math.ceil(duration * factor / 3600.0)
    return int(min(max(hours, 1) * 3600, MAX_RUNTIME_S))


def gang_of(gpus: int, per_node: int = 8) -> tuple[tuple[str, int, int], ...]:
    """Replicas for a job of ``gpus`` GPUs: one replica up to a node, else whole-node replicas."""
    if gpus <= per_node:
        return (("worker", 1, gpus),)
    full, rest = divmod(gpus, per_node)
    roles: tuple[tuple[str, int, int], ...] = (("worker", full, per_node),)
    if rest:
        roles += (("tail", 1, rest),)
    return roles


def traces_dir(path: str | os.PathLike[str] | None = None) -> Path:
    """Where the traces are: ``path``, else ``$TRAINYARD_TRACES``, else ``../shared/traces`` of the repo."""
    if path is not None:
        return Path(path)
    env = os.environ.get("TRAINYARD_TRACES")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[3].parent / "shared" / "traces"


def tenancy_for(
    quotas: dict[str, int], borrowing: bool = True, preemption: bool = True, half_life_s: float = 7 * 86400.0,
    fair_share_preemption: bool = True, min_runtime_s: float = 1800.0,
) -> Tenancy:
    """One queue per tenant with ``quotas[tenant]`` nominal GPUs, under one organisation.

    Without ``borrowing`` every tenant is held to its nominal quota (Philly's
    virtual clusters were dedicated partitions).
    """
    limit = None if borrowing else 0
    queues = [
        QueueQuota(tenant=t, name=QUEUE, cohort="org", quota={GPU_TYPE: FlavorQuota(nominal=n, borrowing_limit=limit)},
                   weight=max(float(n), 1.0))
        for t, n in sorted(quotas.items())
    ]
    total = sum(quotas.values())
    settings = PreemptionSettings(within_queue=preemption, reclaim=preemption,
                                  fair_share=preemption and fair_share_preemption, min_runtime_s=min_runtime_s)
    return Tenancy(
        queues=queues, cohorts=[Cohort(name="org", quota={GPU_TYPE: FlavorQuota(nominal=total)})],
        flavors=[GPU_TYPE], half_life_s=half_life_s, preemption=settings,
        priority_classes=[PriorityClass("production", 1000, preemptible=False), PriorityClass("standard", 500)],
    )


class Workload:
    """Jobs in submission order, the tenants' nominal quotas (GPUs) and where it came from."""

    def __init__(self, jobs: list[SimJob], quotas: dict[str, int], source: str) -> None:
        self.jobs = jobs
        self.quotas = quotas
        self.source = source

    def scaled(self, rate: float) -> Workload:
        """The same jobs arriving ``rate`` times as fast (what-if: more load)."""
        if rate <= 0:
            raise ValueError("arrival-rate scale must be positive")
        t0 = self.jobs[0].submit if self.jobs else 0.0
        jobs = [SimJob(j.index, j.tenant, t0 + (j.submit - t0) / rate, j.duration, j.roles, j.limit_s,
                       j.priority_class) for j in self.jobs]
        return Workload(jobs, dict(self.quotas), f"{self.source} x{rate:g} arrivals")

    def with_quotas(self, overrides: dict[str, int]) -> Workload:
        unknown = set(overrides) - set(self.quotas)
        if unknown:
            raise ValueError(f"no such tenant(s): {', '.join(sorted(unknown))}; tenants: {', '.join(sorted(self.quotas))}")
        return Workload(self.jobs, {**self.quotas, **overrides}, self.source)


def _epoch(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc).timestamp()


def load_philly(
    traces: str | os.PathLike[str] | None = None, start: str | None = None, end: str | None = None,
    default_vc_nodes: int = 2, limit: int | None = None,
) -> Workload:
    """The Philly jobs (optionally those submitted in ``[start, end)``, dates ``YYYY-mm-dd``), VCs as tenants."""
    base = traces_dir(traces) / "philly"
    sizes: dict[str, int] = {}
    with open(base / "philly_vc_nodes.csv", newline="") as f:
        for row in csv.DictReader(f):
            sizes[row["vc"]] = int(row["node num"]) * 8
    lo = _epoch(start + " 00:00:00") if start else -math.inf
    hi = _epoch(end + " 00:00:00") if end else math.inf
    rows: list[tuple[float, float, int, str]] = []
    with open(base / "philly_jobs_adaptdl.csv", newline="") as f:
        for row in csv.DictReader(f):
            t = _epoch(row["timestamp"])
            if lo <= t < hi:
                rows.append((t, float(row["duration"]), int(row["num_gpus"]), row["cluster"]))
    rows.sort()  # the file is not in submission order
    if limit is not None:
        rows = rows[:limit]
    t0 = rows[0][0] if rows else 0.0
    jobs = [SimJob(i, vc, t - t0, d, gang_of(g)) for i, (t, d, g, vc) in enumerate(rows)]
    quotas = {vc: sizes.get(vc, default_vc_nodes * 8) for vc in sorted({j.tenant for j in jobs} | set(sizes))}
    return Workload(jobs, quotas, f"philly {start or 'start'}..{end or 'end'}")


def synthetic(
    n_jobs: int, gpus: int, seed: int = 0, load: float = 0.8, tenants: int = 8, rl_share: float = 0.05,
) -> Workload:
    """Today's mix on a cluster of ``gpus`` GPUs at roughly ``load`` of its capacity.

    Many 1-8 GPU jobs (minutes to hours), some 64-512 GPU gangs (hours to a
    day), a few 1,024-4,096 GPU pre-training runs (days), and RL jobs with a
    trainer and a rollout role.  Tenants get quotas by a fixed skew (the first
    tenants are larger), and submit in proportion to them.
    """
    rng = random.Random(seed)
    weights = [1.0 / (k + 1) for k in range(tenants)]
    total_w = sum(weights)
    names = [f"team{k:02d}" for k in range(tenants)]
    quotas = {n: max(8, int(gpus * w / total_w) // 8 * 8) for n, w in zip(names, weights)}
    largest = max(8, min(4096, gpus // 2))
    kinds = ("small", "mid", "gang", "huge", "rl")
    mix = (0.86 - rl_share, 0.09, 0.05, 0.0002, rl_share)  # share of jobs of each kind
    specs = []
    for _ in range(n_jobs):
        tenant = rng.choices(names, weights)[0]
        kind = rng.choices(kinds, mix)[0]
        if kind == "small":
            g = rng.choice((1, 1, 1, 2, 4, 8, 8))
            roles, dur = gang_of(g), rng.lognormvariate(math.log(1800), 1.3)
        elif kind == "mid":
            g = rng.choice((16, 32))
            roles, dur = gang_of(g), rng.lognormvariate(math.log(3 * 3600), 1.0)
        elif kind == "gang":
            g = min(rng.choice((64, 128, 256, 512)), largest)
            roles, dur = gang_of(g), rng.lognormvariate(math.log(2 * 3600), 1.0)
        elif kind == "huge":
            g = min(rng.choice((1024, 2048, 4096)), largest)
            roles, dur = gang_of(g), rng.lognormvariate(math.log(3 * 86400), 0.5)
        else:
            t, r = rng.choice(((2, 2), (4, 4), (8, 8), (16, 8)))
            t, r = min(t, largest // 16 or 1), min(r, largest // 16 or 1)
            roles, dur = (("trainer", t, 8), ("rollout", r, 8)), rng.lognormvariate(math.log(8 * 3600), 0.8)
        specs.append((tenant, roles, min(dur, 30 * 86400.0)))
    work = sum(sum(r * g for _, r, g in roles) * d for _, roles, d in specs)
    span = work / (gpus * load)  # seconds over which arrivals spread to reach the load
    times = sorted(rng.uniform(0, span) for _ in range(n_jobs))
    jobs = [SimJob(i, t, at, d, roles) for i, (at, (t, roles, d)) in enumerate(zip(times, specs))]
    return Workload(jobs, quotas, f"synthetic n={n_jobs} seed={seed} load={load}")
