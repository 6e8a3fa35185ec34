"""Scheduling quality: every policy on Philly at three offered loads and on the synthetic mix with failures.

    .venv/bin/python bench/quality.py                 # the full table (tens of minutes on 2 cores)
    .venv/bin/python bench/quality.py --quick         # a smoke test of the same table (a minute or two)
    .venv/bin/python bench/quality.py --out bench/results/quality.json

Workloads (docs/simulator.md):
- Philly (Jeon et al., ATC'19; trace CC BY 4.0) on its 2,816-GPU cluster, arrivals moved so that the
  offered load (GPU-seconds demanded / (cluster GPUs x submission span)) is 0.7, 0.9 and 1.1; one
  shared cluster with the VCs' quotas as nominal quota and borrowing on; no node failures.
- The synthetic LLM-era mix (1-8 GPU jobs, 16-512 GPU gangs, RL jobs) at offered load 0.8 and 0.95
  with node failures at Llama 3 rates.

Per policy: average, p50 and p99 job completion time, average and p99 wait, utilisation, GPU-hours
lost to preemption (and all lost work), preemptions, and Jain's index over contended samples and over
contended days (the samples of each day summed first, so indivisible gangs may take turns).  Then
the issue's goals, each measured (met or not), never asserted.  A progress line per policy goes to
stderr while it runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from trainyard.sim import FailureModel, Scenario
from trainyard.sim.report import summarise
from trainyard.sim.scenarios import prepare, run_policies

POLICIES = ["trainyard", "fifo", "sjf", "sjf-backfill", "slurm", "tiresias"]
H = 3600.0


def progress(name: str, done: int, total: int, started: dict[str, float]) -> None:
    now = time.perf_counter()
    started.setdefault(name, now)
    print(
        f"\r  {name:>13}: {done:>7,} / {total:,} jobs done, {now - started[name]:6.1f} s",
        end="",
        file=sys.stderr,
        flush=True,
    )
    if done >= total:
        print(file=sys.stderr)


def run_case(title: str, plan_args: dict, failures: FailureModel, policies: list[str]) -> dict:
    plan = prepare(**plan_args)
    print(
        f"{title}: {len(plan.workload.jobs):,} jobs on {len(plan.nodes):,} nodes ({plan.gpus:,} GPUs), "
        f"offered load {plan.load_after:.2f}",
        file=sys.stderr,
    )
    scenario = Scenario(
        tick_s=60.0,
        seed=plan_args.get("seed", 0),
        failures=failures,
        borrowing=True,
        record_events=False,
        fragmentation_samples=0,
    )
    started: dict[str, float] = {}
    walls: dict[str, float] = {}
    summaries = []
    for name in policies:
        t0 = time.perf_counter()
        sims = run_policies(
            plan.workload, plan.nodes, [name], scenario, progress=lambda n, d, t: progress(n, d, t, started)
        )
        walls[name] = time.perf_counter() - t0
        summaries.append(summarise(sims[0]))
    return {
        "title": title,
        "jobs": len(plan.workload.jobs),
        "gpus": plan.gpus,
        "offered_load": plan.load_after,
        "summaries": summaries,
        "wall_s": walls,
    }


def row(s: dict, wall: float) -> str:
    lost = s["lost_to_preemption_gpu_hours"]
    share = lost / s["delivered_gpu_hours"] if s["delivered_gpu_hours"] else 0.0
    jain, per_day = s["jain_contended"], s.get("jain_contended_24h")
    return (
        f"| {s['policy']} | {s['jct_avg_s'] / H:.2f} | {s['jct_p50_s'] / H:.2f} | {s['jct_p99_s'] / H:.1f} | "
        f"{s['wait_avg_s'] / H:.2f} | {s['wait_p99_s'] / H:.1f} | {s['utilisation']:.3f} | "
        f"{lost:,.0f} ({share:.1%}) | {s['lost_gpu_hours']:,.0f} | {s['preemptions']:,} | "
        f"{'-' if jain is None else f'{jain:.3f}'} | {'-' if per_day is None else f'{per_day:.3f}'} | "
        f"{s['unfinished'] + s['failed']} | {wall:.0f} |"
    )


def goals(case: dict) -> list[str]:
    """The issue's goals for this row, measured."""
    by = {s["policy"]: s for s in case["summaries"]}
    ty = by.get("trainyard")
    if ty is None:
        return []
    out = []

    def check(text: str, ok: bool) -> None:
        out.append(f"- {'met' if ok else 'NOT met'}: {text}")

    jct = ty["jct_avg_s"]
    if "fifo" in by:
        f = by["fifo"]["jct_avg_s"]
        check(f"avg JCT {jct / H:.2f} h <= FIFO's {f / H:.2f} h", jct <= f)
        if case["offered_load"] >= 0.9 - 1e-9:
            check(f"avg JCT <= 0.8 x FIFO's ({jct / f:.2f}x)", jct <= 0.8 * f)
        check(
            f"p99 wait {ty['wait_p99_s'] / H:.1f} h <= FIFO's {by['fifo']['wait_p99_s'] / H:.1f} h",
            ty["wait_p99_s"] <= by["fifo"]["wait_p99_s"],
        )
    if "slurm" in by:
        sl = by["slurm"]["jct_avg_s"]
        check(f"avg JCT <= Slurm-like's {sl / H:.2f} h ({jct / sl:.2f}x)", jct <= sl)
    for oracle in ("sjf", "sjf-backfill"):
        if oracle in by:
            o = by[oracle]["jct_avg_s"]
            check(f"avg JCT within 1.3x of {oracle} ({jct / o:.2f}x)", jct <= 1.3 * o)
    delivered = ty["delivered_gpu_hours"] or 1.0
    share = ty["lost_to_preemption_gpu_hours"] / delivered
    check(f"GPU-hours lost to preemption {share:.2%} of delivered <= 2 %", share <= 0.02)
    if ty["jain_contended"] is not None:
        check(f"Jain's index over contended samples {ty['jain_contended']:.3f} >= 0.95", ty["jain_contended"] >= 0.95)
    if ty.get("jain_contended_24h") is not None:
        check(
            f"Jain's index over contended days {ty['jain_contended_24h']:.3f} >= 0.95", ty["jain_contended_24h"] >= 0.95
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--quick",
        action="store_true",
        help="a smoke test: 6,000 Philly jobs (on Philly's whole cluster nobody waits, so every policy ties "
        "there) and 4,000 synthetic jobs on 64 nodes",
    )
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--synthetic-jobs", type=int, default=20_000)
    ap.add_argument("--synthetic-nodes", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--philly-loads", default="0.7,0.9,1.1")
    ap.add_argument("--synthetic-loads", default="0.8,0.95")
    ap.add_argument(
        "--traces", default=None, help="traces folder (default: $TRAINYARD_TRACES, else the repository's traces/)"
    )
    ap.add_argument("--out", default=None, help="write every summary as JSON here")
    args = ap.parse_args()
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    jobs, nodes = (4_000, 64) if args.quick else (args.synthetic_jobs, args.synthetic_nodes)
    philly_limit = 6_000 if args.quick else None
    cases = []
    for load in [float(x) for x in args.philly_loads.split(",") if x]:
        cases.append(
            run_case(
                f"Philly at offered load {load:g}",
                {"workload": "philly", "traces": args.traces, "target_load": load, "limit": philly_limit},
                FailureModel(enabled=False),
                policies,
            )
        )
    for load in [float(x) for x in args.synthetic_loads.split(",") if x]:
        cases.append(
            run_case(
                f"Synthetic mix with failures at offered load {load:g}",
                {
                    "workload": "synthetic",
                    "jobs": jobs,
                    "nodes": nodes,
                    "seed": args.seed,
                    "load": load,
                    "target_load": load,
                },
                FailureModel(),
                policies,
            )
        )
    for case in cases:
        print(f"\n### {case['title']} ({case['jobs']:,} jobs, {case['gpus']:,} GPUs)\n")
        print(
            "| policy | avg JCT h | p50 JCT h | p99 JCT h | avg wait h | p99 wait h | util | lost to preemption "
            "GPU·h (of delivered) | all lost GPU·h | preemptions | Jain (contended) | Jain (per day) | unfinished | wall s |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for s in case["summaries"]:
            print(row(s, case["wall_s"][s["policy"]]))
        lines = goals(case)
        if lines:
            print("\n" + "\n".join(lines))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(cases, indent=2))
        print(f"\nsummaries written to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
