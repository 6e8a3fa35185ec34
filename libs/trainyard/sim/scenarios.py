"""Workload and cluster together, with the what-if knobs (more nodes, other quotas, more load).

:func:`prepare` turns the command line's choices into a :class:`Plan`: the
workload (Philly, synthetic or a trace file) and the nodes it runs on
(generated, or a node-list file), with quotas, load and GPU types made to fit
that cluster.  :func:`run_policies` runs one policy after another on fresh
copies of the cluster; :func:`run_partitioned` runs each tenant alone on
dedicated nodes of its quota's size (Philly's virtual clusters) and merges the
results per policy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from msgspec.structs import replace

from trainyard.domain.node import NodeInfo
from trainyard.sim.cluster import SimCluster, build_nodes
from trainyard.sim.engine import Scenario, Simulator, simulate
from trainyard.sim.policies import policy_named
from trainyard.sim.workloads import Workload, gang_of, load_philly, synthetic

Progress = Callable[[str, int, int], None]  # (policy, jobs finished or rejected, jobs in all)


def parse_quotas(items: list[str]) -> dict[str, int]:
    """``["vc1=128", "team00=4096"]`` -> ``{"vc1": 128, "team00": 4096}``."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not value.strip().isdigit():
            raise ValueError(f"quota override {item!r}: write TENANT=GPUS, e.g. team00=512")
        out[name.strip()] = int(value)
    return out


def build(
    workload: str = "philly",
    traces: str | None = None,
    jobs: int = 10_000,
    nodes: int = 512,
    seed: int = 0,
    load: float = 0.8,
    start: str | None = None,
    end: str | None = None,
    add_nodes: int = 0,
    quotas: dict[str, int] | None = None,
    arrival_scale: float = 1.0,
    limit: int | None = None,
) -> tuple[Workload, int]:
    """The workload and the number of 8-GPU nodes to run it on.

    Philly runs on the sum of its VCs (the quotas); a synthetic mix on
    ``nodes`` nodes.  ``add_nodes`` adds nodes without changing any quota (the
    extra capacity is there to borrow).
    """
    if workload == "philly":
        w = load_philly(traces, start=start, end=end, limit=limit)
        base_nodes = sum(w.quotas.values()) // 8
    elif workload == "synthetic":
        w = synthetic(jobs, nodes * 8, seed=seed, load=load)
        base_nodes = nodes
    else:
        raise ValueError(f"unknown workload {workload!r}; choose philly or synthetic")
    if quotas:
        w = w.with_quotas(quotas)
    if arrival_scale != 1.0:
        w = w.scaled(arrival_scale)
    return w, base_nodes + add_nodes


class Plan(NamedTuple):
    workload: Workload
    nodes: list[NodeInfo]  # the cluster; every policy runs on a fresh copy
    load_before: float  # offered load on these nodes as loaded
    load_after: float  # and after --target-load / --arrival-scale
    partitioned: bool  # each tenant on its own nodes of its quota's size

    @property
    def gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)


YEAR_S = 365.25 * 86_400.0
MAX_SPAN_S = 100 * YEAR_S  # arrivals spread wider than this are a mistake (a load of 1e-9), not a study


def prepare(
    workload: str = "philly",
    traces: str | None = None,
    jobs: int = 10_000,
    nodes: int = 512,
    seed: int = 0,
    load: float = 0.8,
    start: str | None = None,
    end: str | None = None,
    add_nodes: int = 0,
    quotas: dict[str, int] | None = None,
    arrival_scale: float = 1.0,
    limit: int | None = None,
    trace: str | None = None,
    nodes_file: str | None = None,
    target_load: float | None = None,
    partition: bool = False,
) -> Plan:
    """The workload and its cluster, every what-if knob applied; ``ValueError`` says what is wrong.

    A ``trace`` file runs on ``nodes`` generated 8-GPU nodes, or on exactly
    the nodes of ``nodes_file``; its tenants' quotas split the cluster's GPUs
    by the GPU-seconds each submitted, unless ``quotas`` names them.
    ``target_load`` moves arrivals so that the offered load on the cluster is
    that value (``Workload.offered_load``).
    """
    from trainyard.sim.traces import load_nodes, load_trace

    if target_load is not None and arrival_scale != 1.0:
        raise ValueError("give either --target-load or --arrival-scale, not both")
    if partition and nodes_file:
        raise ValueError("--partition-by-tenant builds each tenant's own nodes from its quota; drop --nodes-file")
    if trace:
        w = load_trace(trace)
        node_list = load_nodes(nodes_file) if nodes_file else build_nodes(nodes)
        w = w.split_by_demand(sum(n.gpus for n in node_list))
    else:
        w, n = build(workload, traces, jobs, nodes, seed, load, start, end, limit=limit)
        node_list = load_nodes(nodes_file) if nodes_file else build_nodes(n)
    if add_nodes:
        model = node_list[0].gpu_type
        node_list = node_list + build_nodes(add_nodes, gpu_type=model, prefix="added-n")
    if quotas:
        w = w.with_quotas(quotas)
    if partition:
        active = sorted({j.tenant for j in w.jobs})
        empty = [t for t in active if w.quotas.get(t, 0) <= 0]
        if empty:
            raise ValueError(
                f"tenant(s) {', '.join(empty)} have a quota of 0 GPUs and so no partition; "
                f"give them one with --quota {empty[0]}=GPUS"
            )
        node_list = [n for t in active for n in partition_nodes(t, w.quotas[t])]
    w = fit_to_nodes(w, node_list)
    gpus = sum(n.gpus for n in node_list)
    before = w.offered_load(gpus)
    if target_load is not None:
        w = w.at_load(target_load, gpus)
    elif arrival_scale != 1.0:
        w = w.scaled(arrival_scale)
    if w.span_s() > MAX_SPAN_S:
        raise ValueError(
            f"the jobs would arrive over {w.span_s() / YEAR_S:,.3g} years; a simulation spans at most "
            f"{MAX_SPAN_S / YEAR_S:.0f} years of arrivals: raise the load or the arrival scale"
        )
    return Plan(w, node_list, before, w.offered_load(gpus), partition)


def fit_to_nodes(w: Workload, nodes: list[NodeInfo]) -> Workload:
    """Jobs on GPU types the cluster has, in replicas no larger than the largest node of their type.

    A job that named no type (``GPU_TYPE`` without a constraint for it) runs
    on the cluster's type with the most GPUs when the cluster lacks
    ``GPU_TYPE``; a job that names a type the cluster does not have is an
    error that names it.
    """
    if not nodes:
        raise ValueError("the cluster has no nodes")
    models: dict[str, int] = {}
    widest: dict[str, int] = {}
    for n in nodes:
        models[n.gpu_type] = models.get(n.gpu_type, 0) + n.gpus
        widest[n.gpu_type] = max(widest.get(n.gpu_type, 0), n.gpus)
    main = max(sorted(models), key=lambda m: models[m])  # most GPUs; ties by name
    foreign = {t: c for t, c in w.type_constraints.items() if t not in models}
    if foreign:
        asked = ", ".join(f"{t} ({c:,} job{'s' if c != 1 else ''})" for t, c in sorted(foreign.items()))
        have = ", ".join(sorted(models))
        raise ValueError(
            f"jobs ask for a GPU type the cluster does not have: {asked}; its GPUs are {have}. "
            "Change their gpu_type, or leave it empty to run on any type"
        )
    jobs = []
    changed = False
    for j in w.jobs:
        model = j.gpu_type if j.gpu_type in models else main
        wide = widest[model]
        roles = j.roles if all(g <= wide for _, _, g in j.roles) else gang_of(j.gpus, per_node=wide)
        if model != j.gpu_type or roles is not j.roles:
            j = j.but(gpu_type=model, roles=roles)
            changed = True
        jobs.append(j)
    return w._like(jobs, dict(w.quotas), w.source) if changed else w


def partition_nodes(tenant: str, gpus: int) -> list[NodeInfo]:
    """A tenant's dedicated nodes: ``gpus`` GPUs as 8-GPU nodes (and one smaller node for a remainder)."""
    full, rest = divmod(max(gpus, 0), 8)
    out = build_nodes(full, prefix=f"{tenant}-n")
    if rest:
        last = build_nodes(1, gpus_per_node=rest, prefix=f"{tenant}-r")[0]
        out.append(replace(last, rack=out[-1].rack if out else last.rack))
    return [replace(n, labels={"partition": tenant}) for n in out]


class Watched(Simulator):
    """A simulator that reports how many jobs are finished every ``every`` scheduling cycles."""

    def __init__(self, *args: object, progress: Callable[[int, int], None], every: int = 64, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self._progress, self._every = progress, every

    def cycle(self) -> None:
        super().cycle()
        if self.cycles % self._every == 0:
            self._progress(len(self.jobs) - self.left, len(self.jobs))


def _simulate(
    w: Workload, nodes: list[NodeInfo], name: str, scenario: Scenario, progress: Callable[[int, int], None] | None
) -> Simulator:
    if progress is None:
        return simulate(w, SimCluster(nodes), policy_named(name), scenario)
    return Watched(w, SimCluster(nodes), policy_named(name), scenario, progress=progress).run()


def run_policies(
    workload: Workload,
    nodes: int | list[NodeInfo],
    policies: list[str],
    scenario: Scenario,
    progress: Progress | None = None,
) -> list[Simulator]:
    """One simulation per policy, one after another, each on a fresh cluster (``nodes`` 8-GPU nodes or that list)."""
    node_list = build_nodes(nodes) if isinstance(nodes, int) else nodes
    for name in policies:
        policy_named(name)  # an unknown name fails before anything runs
    sims = []
    for name in policies:
        if progress:
            progress(name, 0, len(workload.jobs))
        report = (lambda done, total, name=name: progress(name, done, total)) if progress else None
        sims.append(_simulate(workload, node_list, name, scenario, report))
        if progress:
            progress(name, len(workload.jobs), len(workload.jobs))
    return sims


def simulate_partitions(
    workload: Workload, policy: str, scenario: Scenario, progress: Progress | None = None
) -> dict[str, Simulator]:
    """Each tenant with jobs alone, on its own nodes of its quota's size, without borrowing: tenant -> simulation."""
    policy_named(policy)
    tenants = sorted({j.tenant for j in workload.jobs})
    alone = replace(scenario, borrowing=False)
    total = len(workload.jobs)
    sims: dict[str, Simulator] = {}
    finished = 0
    if progress:
        progress(policy, 0, total)
    for t in tenants:
        nodes = partition_nodes(t, workload.quotas.get(t, 0))
        if not nodes:
            raise ValueError(f"tenant {t} has a quota of 0 GPUs: give it a quota (--quota {t}=GPUS)")
        part = fit_to_nodes(workload.partition(t), nodes)
        report = None
        if progress:

            def report(done: int, _all: int, base: int = finished) -> None:
                progress(policy, base + done, total)

        sims[t] = _simulate(part, nodes, policy, alone, report)
        finished += len(part.jobs)
    if progress:
        progress(policy, total, total)
    return sims


def run_partitioned(
    workload: Workload, policies: list[str], scenario: Scenario, progress: Progress | None = None
) -> list[dict]:
    """Per policy, each tenant alone on its own nodes of its quota's size; one merged summary per policy."""
    from trainyard.sim.report import merge_partitions

    for name in policies:
        policy_named(name)
    return [
        merge_partitions(
            simulate_partitions(workload, name, scenario, progress), f"{workload.source}, one partition per tenant"
        )
        for name in policies
    ]
