"""Workload and cluster together, with the what-if knobs (more nodes, other quotas, more load)."""

from __future__ import annotations

from trainyard.sim.cluster import SimCluster, build_nodes
from trainyard.sim.engine import Scenario, simulate
from trainyard.sim.policies import policy_named
from trainyard.sim.workloads import Workload, load_philly, synthetic


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
    workload: str = "philly", traces: str | None = None, jobs: int = 10_000, nodes: int = 512, seed: int = 0,
    load: float = 0.8, start: str | None = None, end: str | None = None, add_nodes: int = 0,
    quotas: dict[str, int] | None = None, arrival_scale: float = 1.0, limit: int | None = None,
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


def run_policies(workload: Workload, nodes: int, policies: list[str], scenario: Scenario) -> list:
    """One simulation per policy, each on a fresh cluster of ``nodes`` 8-GPU nodes."""
    sims = []
    for name in policies:
        sims.append(simulate(workload, SimCluster(build_nodes(nodes)), policy_named(name), scenario))
    return sims
