"""Simulator benchmark: the whole Philly trace on its cluster, and a large synthetic mix with failures.

    .venv/bin/python bench/sim.py --philly                      # every policy on all 82k Philly jobs
    .venv/bin/python bench/sim.py --synthetic 1000000 --nodes 4096 --policies trainyard
    .venv/bin/python bench/sim.py --helios                      # FIFO/SJF per VC beside Helios SC'21

Prints the wall time of each run and the policies side by side.
"""

from __future__ import annotations

import argparse
import time

from trainyard.sim import (
    FailureModel,
    Scenario,
    SimCluster,
    build_nodes,
    load_philly,
    policy_named,
    simulate,
    synthetic,
)
from trainyard.sim.report import markdown_table, summarise


def _table(title: str, rows: list[tuple[dict, float, float]]) -> None:
    print(f"\n## {title}\n")
    print(markdown_table([s for s, _, _ in rows]))
    print("\n| policy | wall s | CPU s | cycles | jobs/s |\n|---|---|---|---|---|")
    for s, wall, cpu in rows:
        print(f"| {s['policy']} | {wall:.1f} | {cpu:.1f} | {s['cycles']} | {s['jobs'] / wall:,.0f} |")


def philly(policies: list[str], traces: str | None, tick: float) -> None:
    t0 = time.perf_counter()
    w = load_philly(traces)
    nodes = sum(w.quotas.values()) // 8
    print(
        f"philly: loaded {len(w.jobs):,} jobs in {time.perf_counter() - t0:.1f} s; {nodes} nodes x 8 GPUs, "
        f"VCs without borrowing, tick {tick:g} s"
    )
    rows = []
    for name in policies:
        t0, c0 = time.perf_counter(), time.process_time()
        sim = simulate(
            w,
            SimCluster(build_nodes(nodes)),
            policy_named(name),
            Scenario(tick_s=tick, borrowing=False, record_events=False),
        )
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        rows.append((summarise(sim), wall, cpu))
        print(f"  {name}: {wall:.1f} s wall, {cpu:.1f} s CPU", flush=True)
    _table("Philly (82k jobs)", rows)


def helios(traces: str | None, tick: float, arrival_scale: float) -> None:
    """FIFO and SJF per Philly VC, Oct-Nov 2017, beside Helios (SC'21) QSSF artifact numbers."""
    import csv

    from trainyard.sim.workloads import traces_dir

    w = load_philly(traces, start="2017-10-01", end="2017-12-01")
    if arrival_scale != 1.0:
        w = w.scaled(arrival_scale)
    nodes = sum(w.quotas.values()) // 8
    ours = {}
    for name in ("fifo", "sjf"):
        t0 = time.perf_counter()
        sim = simulate(
            w,
            SimCluster(build_nodes(nodes)),
            policy_named(name),
            Scenario(tick_s=tick, borrowing=False, record_events=False, fragmentation_samples=0),
        )
        per_vc: dict[str, list[tuple[float, float]]] = {}
        for st in sim.jobs:
            if st.end is not None:
                per_vc.setdefault(st.job.tenant, []).append((st.end - st.job.submit, st.first_start - st.job.submit))
        per_vc["all"] = [x for v in list(per_vc.values()) for x in v]
        ours[name] = {vc: (sum(a for a, _ in v) / len(v), sum(b for _, b in v) / len(v)) for vc, v in per_vc.items()}
        print(f"  {name}: {time.perf_counter() - t0:.1f} s")
    ref = traces_dir(traces) / "reference" / "helios_sc21_qssf_philly_per_vc.csv"
    print(f"\n## Philly Oct-Nov 2017 ({len(w.jobs):,} jobs, arrivals x{arrival_scale:g}): ours vs Helios SC'21\n")
    print(
        "| VC | nodes | FIFO JCT ours | FIFO JCT Helios | SJF JCT ours | SJF JCT Helios "
        "| FIFO wait ours | FIFO wait Helios | SJF wait ours | SJF wait Helios |"
    )
    print("|" + "---|" * 10)
    with open(ref, newline="") as f:
        for row in csv.DictReader(f):
            vc = row["vc"]
            fifo, sjf = ours["fifo"].get(vc, (0.0, 0.0)), ours["sjf"].get(vc, (0.0, 0.0))
            print(
                f"| {vc} | {row['nodes_8gpu']} | {fifo[0]:,.0f} | {int(row['fifo_avg_jct_s']):,} | {sjf[0]:,.0f} | "
                f"{int(row['sjf_avg_jct_s']):,} | {fifo[1]:,.0f} | {int(row['fifo_avg_queue_s']):,} | "
                f"{sjf[1]:,.0f} | {int(row['sjf_avg_queue_s']):,} |"
            )


def large(jobs: int, nodes: int, policies: list[str], tick: float, seed: int, load: float) -> None:
    t0 = time.perf_counter()
    w = synthetic(jobs, nodes * 8, seed=seed, load=load)
    cluster_nodes = build_nodes(nodes)
    print(
        f"synthetic: {jobs:,} jobs generated in {time.perf_counter() - t0:.1f} s; {nodes:,} nodes x 8 GPUs, "
        f"{w.jobs[-1].submit / 86400:.0f} days of arrivals, Llama 3 failure rates, 1% lemons, tick {tick:g} s"
    )
    rows = []
    for name in policies:
        t0, c0 = time.perf_counter(), time.process_time()
        scenario = Scenario(
            tick_s=tick,
            seed=seed,
            failures=FailureModel(lemon_fraction=0.01),
            record_events=False,
            fragmentation_samples=24,
        )
        sim = simulate(w, SimCluster(cluster_nodes), policy_named(name), scenario)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        rows.append((summarise(sim), wall, cpu))
        print(f"  {name}: {wall:.1f} s wall, {cpu:.1f} s CPU", flush=True)
    _table(f"synthetic ({jobs:,} jobs, {nodes * 8:,} GPUs, failures)", rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--philly", action="store_true", help="replay the whole Philly trace")
    p.add_argument(
        "--traces", default=None, help="traces folder (default $TRAINYARD_TRACES, else the repository's traces/)"
    )
    p.add_argument("--synthetic", type=int, default=0, help="number of synthetic jobs (0: skip)")
    p.add_argument("--nodes", type=int, default=4096)
    p.add_argument("--policies", default="trainyard,fifo,sjf,slurm")
    p.add_argument("--tick", type=float, default=None, help="cycle interval (default 60 s Philly, 600 s synthetic)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--load", type=float, default=0.7)
    p.add_argument("--helios", action="store_true", help="FIFO/SJF per Philly VC beside the Helios paper's numbers")
    p.add_argument("--arrival-scale", type=float, default=1.0, help="--helios: arrivals this many times as fast")
    args = p.parse_args()
    names = [n.strip() for n in args.policies.split(",") if n.strip()]
    if not (args.philly or args.synthetic or args.helios):
        p.error("say --philly, --helios and/or --synthetic N")
    if args.helios:
        helios(args.traces, args.tick or 60.0, args.arrival_scale)
    if args.philly:
        philly(names, args.traces, args.tick or 60.0)
    if args.synthetic:
        large(args.synthetic, args.nodes, names, args.tick or 600.0, args.seed, args.load)


if __name__ == "__main__":
    main()
