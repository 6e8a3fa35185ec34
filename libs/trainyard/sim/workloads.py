"""Workloads for the simulator: the Philly trace and seeded synthetic mixes.

A workload is a list of :class:`SimJob` (sorted by submission time) and the
quota tree (:class:`Tenancy`) its tenants run under.  A job carries its GPU
type, queue and priority class; the simulator's event loop schedules one GPU
pool and one queue per tenant, while :func:`trainyard.sim.tenancy.tenancy_for`
can also build a tree with several GPU types and several queues per tenant.  Traces in the
documented CSV / Parquet format are read by :mod:`trainyard.sim.traces`.

Offered load (:meth:`Workload.offered_load`) is the GPU-seconds the jobs
demand over the GPU-seconds the cluster offers while they are submitted:
``sum(gpus x duration) / (cluster GPUs x (last submit - first submit))``.

Philly (Jeon et al., ATC'19; trace CC BY 4.0, msr-fiddle/philly-traces) comes
from ``philly/philly_jobs_adaptdl.csv`` as copied from petuum/adaptdl
(osdi21-artifact branch); each virtual cluster (VC) is a tenant whose nominal
quota is its size in ``philly/philly_vc_nodes.csv`` (HeliosArtifact, MIT): 8-GPU
nodes per VC.  Jobs larger than 8 GPUs become gangs of 8-GPU replicas (plus one
smaller replica for a remainder).  Both files are in the repository's ``traces/``
folder with their licences (traces/README.md).
"""

from __future__ import annotations

import csv
import math
import os
import random
from datetime import UTC, datetime
from pathlib import Path

from trainyard.domain.job import MAX_RUNTIME_S, JobSpec, Role
from trainyard.settings import load_settings
from trainyard.sim.sources import require

GPU_TYPE = "H100"
QUEUE = "default"


class SimJob:
    """One submitted job: its gang shape, when it arrives and how much work it is."""

    __slots__ = (
        "index",
        "job_id",
        "tenant",
        "submit",
        "duration",
        "roles",
        "gpus",
        "limit_s",
        "priority_class",
        "gpu_type",
        "queue",
        "trace_id",
    )

    def __init__(
        self,
        index: int,
        tenant: str,
        submit: float,
        duration: float,
        roles: tuple[tuple[str, int, int], ...],
        limit_s: int | None = None,
        priority_class: str = "standard",
        gpu_type: str = GPU_TYPE,
        queue: str = QUEUE,
        trace_id: str | None = None,
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
        self.gpu_type = gpu_type  # the GPU type every role runs on
        self.queue = queue  # the tenant's queue it was submitted to
        self.trace_id = trace_id  # the job's id in the trace it came from, if it had one

    def spec(self) -> JobSpec:
        roles = [Role(name=n, replicas=r, gpus_per_replica=g, gpu_type=self.gpu_type) for n, r, g in self.roles]
        return JobSpec(
            tenant=self.tenant,
            queue=self.queue,
            roles=roles,
            priority_class=self.priority_class,
            max_runtime_s=self.limit_s,
            simulated_duration_s=min(self.duration, float(self.limit_s)),
        )

    def but(self, **changes: object) -> SimJob:
        """A copy with some fields changed (``index``, ``submit``, ``roles``, ``gpu_type``, ...)."""
        fields = {
            "index": self.index,
            "tenant": self.tenant,
            "submit": self.submit,
            "duration": self.duration,
            "roles": self.roles,
            "limit_s": self.limit_s,
            "priority_class": self.priority_class,
            "gpu_type": self.gpu_type,
            "queue": self.queue,
            "trace_id": self.trace_id,
        }
        fields.update(changes)
        return SimJob(**fields)  # type: ignore[arg-type]

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


#: The repository's own traces (traces/README.md); an installed package has none.
REPOSITORY_TRACES = Path(__file__).resolve().parents[3] / "traces"


def traces_dir(path: str | os.PathLike[str] | None = None) -> Path:
    """Where the traces are: ``path``, else ``$TRAINYARD_TRACES``, else the repository's ``traces/``."""
    if path is not None:
        return Path(path)
    given = load_settings().traces
    if given:
        return Path(given)
    return REPOSITORY_TRACES


def split(total: int, weights: dict[str, float]) -> dict[str, int]:
    """``total`` split in proportion to ``weights`` (largest remainder: the parts add up to ``total``)."""
    wsum = sum(max(w, 0.0) for w in weights.values())
    if not weights:
        return {}
    if wsum <= 0:
        weights, wsum = dict.fromkeys(weights, 1.0), float(len(weights))
    exact = {k: total * max(w, 0.0) / wsum for k, w in weights.items()}
    out = {k: int(math.floor(v)) for k, v in exact.items()}
    rest = total - sum(out.values())
    for k in sorted(exact, key=lambda k: (out[k] - exact[k], k))[:rest]:
        out[k] += 1
    return out


class Workload:
    """Jobs in submission order, the tenants' nominal quotas (GPUs) and where it came from.

    ``rounded`` counts the jobs whose fractional GPU request was rounded up to
    whole GPUs; ``queues`` lists each tenant's queues; ``type_constraints``
    counts the jobs that asked for a GPU type by name (type -> jobs).
    """

    def __init__(
        self,
        jobs: list[SimJob],
        quotas: dict[str, int],
        source: str,
        rounded: int = 0,
        queues: dict[str, list[str]] | None = None,
        type_constraints: dict[str, int] | None = None,
    ) -> None:
        self.jobs = jobs
        self.quotas = quotas
        self.source = source
        self.rounded = rounded
        self.queues = queues if queues is not None else {t: [QUEUE] for t in quotas}
        self.type_constraints = type_constraints or {}

    def _like(self, jobs: list[SimJob], quotas: dict[str, int], source: str) -> Workload:
        return Workload(jobs, quotas, source, self.rounded, dict(self.queues), dict(self.type_constraints))

    def scaled(self, rate: float) -> Workload:
        """The same jobs arriving ``rate`` times as fast (what-if: more load)."""
        if not rate > 0 or math.isinf(rate):
            raise ValueError("arrival-rate scale must be a positive number")
        t0 = self.jobs[0].submit if self.jobs else 0.0
        jobs = [j.but(submit=t0 + (j.submit - t0) / rate) for j in self.jobs]
        return self._like(jobs, dict(self.quotas), f"{self.source} x{rate:g} arrivals")

    def with_quotas(self, overrides: dict[str, int]) -> Workload:
        unknown = set(overrides) - set(self.quotas)
        if unknown:
            raise ValueError(
                f"no such tenant(s): {', '.join(sorted(unknown))}; tenants: {', '.join(sorted(self.quotas))}"
            )
        return self._like(self.jobs, {**self.quotas, **overrides}, self.source)

    def demand_gpu_s(self) -> dict[str, float]:
        """GPU-seconds each tenant submitted (whole GPUs x duration)."""
        out = dict.fromkeys(self.quotas, 0.0)
        for j in self.jobs:
            out[j.tenant] = out.get(j.tenant, 0.0) + j.gpus * j.duration
        return out

    def split_by_demand(self, gpus: int) -> Workload:
        """Quotas that share ``gpus`` in proportion to the GPU-seconds each tenant submitted."""
        demand = self.demand_gpu_s()
        quotas = split(gpus, demand)
        for t in sorted(quotas, key=lambda t: (quotas[t], t)):
            if quotas[t] == 0 and demand[t] > 0:  # a tenant that submits work gets at least one GPU
                richest = max(quotas, key=lambda k: (quotas[k], k))
                if quotas[richest] > 1:
                    quotas[richest] -= 1
                    quotas[t] = 1
        return self._like(self.jobs, quotas, self.source)

    def span_s(self) -> float:
        """Seconds from the first submission to the last."""
        return self.jobs[-1].submit - self.jobs[0].submit if self.jobs else 0.0

    def offered_load(self, gpus: int) -> float:
        """Total GPU-seconds demanded / (``gpus`` x submission span); inf when every job arrives at once."""
        if gpus <= 0:
            raise ValueError("the cluster must have at least one GPU")
        work = sum(j.gpus * j.duration for j in self.jobs)
        span = self.span_s()
        if work == 0:
            return 0.0
        return work / (gpus * span) if span > 0 else math.inf

    def at_load(self, target: float, gpus: int) -> Workload:
        """The same jobs with arrival times stretched or squeezed so that ``offered_load(gpus) == target``."""
        if not target > 0 or math.isinf(target):
            raise ValueError(f"target load must be a positive number, not {target}")
        now = self.offered_load(gpus)
        if now == 0 or math.isinf(now):
            raise ValueError(
                "the load of a workload whose jobs all arrive at the same moment cannot be changed "
                "by moving arrivals; it needs at least two submission times"
            )
        w = self.scaled(target / now)
        w.source = f"{self.source} at load {target:g}"
        return w

    def partition(self, tenant: str) -> Workload:
        """One tenant's jobs, numbered from 0, with only its quota (a dedicated partition)."""
        jobs = [j.but(index=k) for k, j in enumerate(j for j in self.jobs if j.tenant == tenant)]
        return Workload(
            jobs,
            {tenant: self.quotas[tenant]},
            f"{self.source} [{tenant}]",
            queues={tenant: self.queues.get(tenant, [QUEUE])},
        )


def _epoch(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()


def load_philly(
    traces: str | os.PathLike[str] | None = None,
    start: str | None = None,
    end: str | None = None,
    default_vc_nodes: int = 2,
    limit: int | None = None,
) -> Workload:
    """The Philly jobs (optionally those submitted in ``[start, end)``, dates ``YYYY-mm-dd``), VCs as tenants."""
    folder = traces_dir(traces)
    require(folder, "philly", ("philly_vc_nodes.csv", "philly_jobs_adaptdl.csv"))
    base = folder / "philly"
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
    n_jobs: int, gpus: int, seed: int = 0, load: float = 0.8, tenants: int = 8, rl_share: float = 0.05
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
    quotas = {n: max(8, int(gpus * w / total_w) // 8 * 8) for n, w in zip(names, weights, strict=True)}
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
    jobs = [SimJob(i, t, at, d, roles) for i, (at, (t, roles, d)) in enumerate(zip(times, specs, strict=True))]
    return Workload(jobs, quotas, f"synthetic n={n_jobs} seed={seed} load={load}")
