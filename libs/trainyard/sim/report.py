"""What a simulation run measured: JCT, waits, utilisation, fairness
(fairness.py), lost work; JSON, CSV and charts."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

from trainyard.sim.fairness import jain, period_fairness, water_fill

if TYPE_CHECKING:
    from trainyard.sim.engine import Simulator

LARGE_GPUS = 1024  # "large job" for goodput under failures


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, math.ceil(q / 100.0 * len(ordered)) - 1))
    return ordered[k]


def summarise(sim: Simulator) -> dict:
    """The run's headline figures (plain data, JSON-ready)."""
    done = [st for st in sim.jobs if st.status == "done"]
    jct = [st.end - st.job.submit for st in done]
    wait = [st.first_start - st.job.submit for st in done]
    total_used = sum(sim.used_s.values()) or 1.0
    demand = dict.fromkeys(sim.workload.quotas, 0.0)
    for st in sim.jobs:
        if st.status != "rejected":
            demand[st.job.tenant] += st.job.gpus * st.job.duration
    # fair: the weighted max-min split of the GPU-seconds actually used, capped by each tenant's demand
    fair = water_fill(demand, sim.entitled, total_used)
    fairness = {}
    ratios = []
    for tenant in sorted(sim.workload.quotas):
        received = sim.used_s[tenant] / total_used
        fair_share = fair[tenant] / total_used
        fairness[tenant] = {
            "received": round(received, 4),
            "entitled": round(sim.entitled[tenant], 4),
            "fair": round(fair_share, 4),
            "ratio": round(received / fair_share, 3) if fair_share else None,
            "demand_gpu_s": round(demand[tenant]),
        }
        if fair_share > 0:
            ratios.append(received / fair_share)
    large = [st for st in sim.jobs if st.job.gpus >= LARGE_GPUS and st.status == "done"]
    useful_large = sum(st.job.gpus * st.job.duration for st in large)
    lost_large = sum(st.gpus_lost for st in large)
    frag = [f for _, f in sim.fragmentation]
    frag_keys = sorted({k for f in frag for k in f})
    return {
        "policy": sim.policy.name,
        "workload": sim.workload.source,
        "gpus": sim.cluster.capacity,
        "jobs": len(sim.jobs),
        "done": len(done),
        "rejected": sum(1 for st in sim.jobs if st.status == "rejected"),
        "unfinished": sum(1 for st in sim.jobs if st.status not in ("done", "rejected")),
        "makespan_s": round(sim.now, 1),
        "jct_avg_s": round(sum(jct) / len(jct), 1) if jct else 0.0,
        "jct_p50_s": round(percentile(jct, 50), 1),
        "jct_p99_s": round(percentile(jct, 99), 1),
        "wait_avg_s": round(sum(wait) / len(wait), 1) if wait else 0.0,
        "wait_p50_s": round(percentile(wait, 50), 1),
        "wait_p99_s": round(percentile(wait, 99), 1),
        "utilisation": round(sim.busy_s / sim.up_s, 4) if sim.up_s else 0.0,
        "fragmentation": {k: round(sum(f.get(k, 0.0) for f in frag) / len(frag), 4) for k in frag_keys},
        "jain_index": round(jain(ratios), 4),
        "jain_contended": round(sum(sim.jain_samples) / len(sim.jain_samples), 4) if sim.jain_samples else None,
        "jain_contended_24h": period_fairness(sim.fair_periods, sim.entitled),
        "fairness": fairness,
        "preemptions": sum(st.preemptions for st in sim.jobs),
        "node_failures": len(sim.failure_log),
        "job_interruptions_by_failure": sum(st.failures for st in sim.jobs),
        "lost_gpu_hours": round(sum(st.gpus_lost for st in sim.jobs) / 3600.0, 1),
        "lost_to_preemption_gpu_hours": round(sum(st.lost_to_preemption for st in sim.jobs) / 3600.0, 1),
        "delivered_gpu_hours": round(sum(st.job.gpus * st.job.duration for st in done) / 3600.0, 1),
        "failed": sum(1 for st in sim.jobs if st.status == "failed"),
        "large_jobs": len(large),
        "large_goodput": round(useful_large / (useful_large + lost_large), 4) if useful_large else None,
        "cycles": sim.cycles,
        "violations": len(sim.violations),
        "invariants_checked": sim.scenario.check_every > 0,  # False: "violations" counts nothing
    }


def write_outputs(sims: list[Simulator], out: str | Path, charts: bool = True) -> dict:
    """summary.json, one jobs CSV and one tenants CSV per policy, and PNG charts under ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    summaries = [summarise(s) for s in sims]
    (out / "summary.json").write_text(json.dumps(summaries, indent=2))
    for sim, summary in zip(sims, summaries, strict=True):
        with open(out / f"jobs_{sim.policy.name}.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(
                [
                    "job_id",
                    "tenant",
                    "gpus",
                    "submit_s",
                    "duration_s",
                    "first_start_s",
                    "end_s",
                    "jct_s",
                    "wait_s",
                    "attempts",
                    "failures",
                    "preemptions",
                    "lost_gpu_s",
                    "status",
                ]
            )
            for st in sim.jobs:
                j = st.job
                end = st.end if st.end is not None else ""
                start = st.first_start if st.first_start is not None else ""
                w.writerow(
                    [
                        j.job_id,
                        j.tenant,
                        j.gpus,
                        f"{j.submit:.0f}",
                        f"{j.duration:.0f}",
                        start,
                        end,
                        f"{st.end - j.submit:.0f}" if st.end is not None else "",
                        f"{st.first_start - j.submit:.0f}" if st.first_start is not None else "",
                        st.attempt,
                        st.failures,
                        st.preemptions,
                        f"{st.gpus_lost:.0f}",
                        st.status,
                    ]
                )
        with open(out / f"tenants_{sim.policy.name}.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["tenant", "quota_gpus", "entitled", "fair", "received", "ratio", "demand_gpu_s"])
            for tenant, row in summary["fairness"].items():
                w.writerow(
                    [
                        tenant,
                        sim.workload.quotas[tenant],
                        row["entitled"],
                        row["fair"],
                        row["received"],
                        row["ratio"],
                        row["demand_gpu_s"],
                    ]
                )
        with open(out / f"timeline_{sim.policy.name}.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["t_s", "utilisation", "pending", "running", "nodes_down"])
            w.writerows(sim.timeline)
    if charts:
        _charts(sims, out)
    return {"summaries": summaries, "out": str(out)}


def _charts(sims: list[Simulator], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for sim in sims:
        jct = sorted(st.end - st.job.submit for st in sim.jobs if st.end is not None)
        if jct:
            ax.plot([max(v, 1.0) for v in jct], [(k + 1) / len(jct) for k in range(len(jct))], label=sim.policy.name)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (s)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title("JCT distribution")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "jct_cdf.png", dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    for sim in sims:
        if sim.timeline:
            ax.plot(
                [t / 86400 for t, *_ in sim.timeline],
                [u for _, u, *_ in sim.timeline],
                label=sim.policy.name,
                linewidth=0.8,
            )
    ax.set_xlabel("day")
    ax.set_ylabel("GPU utilisation")
    ax.set_title("GPUs held by running jobs / GPUs in service")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "utilisation.png", dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    tenants = sorted(sims[0].workload.quotas)
    width = 0.8 / max(len(sims), 1)
    for k, sim in enumerate(sims):
        s = summarise(sim)["fairness"]
        ax.bar(
            [x + k * width for x in range(len(tenants))],
            [s[t]["ratio"] or 0.0 for t in tenants],
            width,
            label=sim.policy.name,
        )
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(tenants))], tenants, rotation=60, fontsize=7)
    ax.set_ylabel("share received / demand-capped fair share")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "fairness.png", dpi=100)
    plt.close(fig)


COLUMNS = [
    ("jct_avg_s", "avg JCT (h)", 3600.0),
    ("jct_p50_s", "p50 JCT (h)", 3600.0),
    ("jct_p99_s", "p99 JCT (h)", 3600.0),
    ("wait_avg_s", "avg wait (h)", 3600.0),
    ("wait_p99_s", "p99 wait (h)", 3600.0),
    ("utilisation", "util", None),
    ("jain_contended", "Jain (queued)", None),
    ("preemptions", "preempt", None),
    ("lost_gpu_hours", "lost GPU·h", None),
    ("large_goodput", "large goodput", None),
    ("unfinished", "unfinished", None),
    ("rejected", "rejected", None),
]


def comparison_rows(summaries: list[dict]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the side-by-side table (one row per policy)."""
    header = ["policy"] + [label for _, label, _ in COLUMNS]
    rows = []
    for s in summaries:
        row = [s["policy"]]
        for key, _, scale in COLUMNS:
            v = s.get(key)
            if v is None:
                row.append("-")
            elif scale:
                row.append(f"{v / scale:.2f}")
            elif isinstance(v, float):
                row.append(f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3f}")
            else:
                row.append(str(v))
        row.append(invariants_cell(s))
        rows.append(row)
    return header + ["invariants"], rows


def invariants_cell(summary: dict) -> str:
    """``not checked`` when the run did not check its invariants, else how many were broken."""
    if summary.get("invariants_checked") is False:
        return "not checked"
    return "0 broken" if not summary.get("violations") else f"{summary['violations']} broken"


def markdown_table(summaries: list[dict]) -> str:
    header, rows = comparison_rows(summaries)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def merge_partitions(parts: dict[str, Simulator], workload: str) -> dict:
    """One summary of a policy run on dedicated partitions: one simulation per tenant, each on its own nodes.

    JCT and wait percentiles are over every job of every partition;
    utilisation is the partitions' utilisation weighted by their GPUs; counts
    are summed.  ``partitions`` keeps each tenant's own figures.  Fair share
    between tenants does not arise (nobody shares), so the Jain indices are None.
    """
    sums = {t: summarise(sim) for t, sim in parts.items()}
    done = [st for sim in parts.values() for st in sim.jobs if st.status == "done"]
    jct = [st.end - st.job.submit for st in done]
    wait = [st.first_start - st.job.submit for st in done]
    gpus = sum(s["gpus"] for s in sums.values())
    large = [st for sim in parts.values() for st in sim.jobs if st.job.gpus >= LARGE_GPUS and st.status == "done"]
    useful_large = sum(st.job.gpus * st.job.duration for st in large)
    lost_large = sum(st.gpus_lost for st in large)
    used = {t: sum(sim.used_s.values()) for t, sim in parts.items()}
    total_used = sum(used.values()) or 1.0

    def total(key: str) -> float:
        return sum(s[key] for s in sums.values())

    policy = next(iter(parts.values())).policy.name if parts else ""
    return {
        "policy": policy,
        "workload": workload,
        "gpus": gpus,
        "jobs": total("jobs"),
        "done": len(done),
        "rejected": total("rejected"),
        "unfinished": total("unfinished"),
        "makespan_s": max((s["makespan_s"] for s in sums.values()), default=0.0),
        "jct_avg_s": round(sum(jct) / len(jct), 1) if jct else 0.0,
        "jct_p50_s": round(percentile(jct, 50), 1),
        "jct_p99_s": round(percentile(jct, 99), 1),
        "wait_avg_s": round(sum(wait) / len(wait), 1) if wait else 0.0,
        "wait_p50_s": round(percentile(wait, 50), 1),
        "wait_p99_s": round(percentile(wait, 99), 1),
        "utilisation": round(sum(s["utilisation"] * s["gpus"] for s in sums.values()) / gpus, 4) if gpus else 0.0,
        "fragmentation": {},
        "jain_index": None,
        "jain_contended": None,
        "jain_contended_24h": None,
        "fairness": {
            t: {
                "received": round(used[t] / total_used, 4),
                "entitled": round(s["gpus"] / gpus, 4),
                "fair": None,
                "ratio": None,
                "demand_gpu_s": s["fairness"][t]["demand_gpu_s"],
            }
            for t, s in sums.items()
        },
        "preemptions": total("preemptions"),
        "node_failures": total("node_failures"),
        "job_interruptions_by_failure": total("job_interruptions_by_failure"),
        "lost_gpu_hours": round(total("lost_gpu_hours"), 1),
        "large_jobs": len(large),
        "large_goodput": round(useful_large / (useful_large + lost_large), 4) if useful_large else None,
        "cycles": total("cycles"),
        "violations": total("violations"),
        "invariants_checked": all(s["invariants_checked"] for s in sums.values()),
        "partitioned": True,
        "partitions": {
            t: {
                k: s[k]
                for k in ("gpus", "jobs", "done", "rejected", "jct_avg_s", "wait_avg_s", "utilisation", "violations")
            }
            for t, s in sums.items()
        },
    }
