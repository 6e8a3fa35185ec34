"""``trainyard sim ...``: the discrete-event simulator."""

from __future__ import annotations

import json
import time

import typer
from rich.console import Console
from rich.table import Table

sim_app = typer.Typer(help="Replay cluster traces through the scheduling core.", no_args_is_help=True)

WORKLOAD = typer.Option("philly", help="philly (the trace) or synthetic (today's mix)")
TRACES = typer.Option(None, help="traces folder (default: $TRAINYARD_TRACES or ../shared/traces)")


def _run(policies: list[str], workload: str, traces: str | None, jobs: int, nodes: int, seed: int, load: float,
         start: str | None, end: str | None, add_nodes: int, quota: list[str], arrival_scale: float, tick: float,
         failures: bool, lemons: float, checkpoint: float, borrowing: bool | None, out: str | None,
         check_every: int, limit: int | None) -> None:
    from trainyard.sim import FailureModel, Scenario
    from trainyard.sim.failures import NO_FAILURES
    from trainyard.sim.report import comparison_rows, summarise, write_outputs
    from trainyard.sim.scenarios import build, parse_quotas, run_policies

    console = Console()
    if not console.is_terminal:
        console = Console(width=200)  # piped or captured: keep the table whole
    try:
        overrides = parse_quotas(quota)
        w, n = build(workload, traces, jobs, nodes, seed, load, start, end, add_nodes, overrides, arrival_scale, limit)
    except (ValueError, OSError) as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from None
    model = FailureModel(lemon_fraction=lemons, checkpoint_interval_s=checkpoint) if failures else NO_FAILURES
    # Philly's VCs were dedicated partitions: no borrowing unless asked for.
    borrow = borrowing if borrowing is not None else workload != "philly"
    scenario = Scenario(tick_s=tick, seed=seed, failures=model, borrowing=borrow, check_every=check_every,
                        record_events=False)
    console.print(f"{w.source}: {len(w.jobs):,} jobs on {n:,} nodes x 8 GPUs, borrowing={'on' if borrow else 'off'}")
    t0 = time.perf_counter()
    try:
        sims = run_policies(w, n, policies, scenario)
    except ValueError as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from None
    elapsed = time.perf_counter() - t0
    summaries = write_outputs(sims, out)["summaries"] if out else [summarise(s) for s in sims]
    header, rows = comparison_rows(summaries)
    table = Table(title=f"{len(policies)} polic{'y' if len(policies) == 1 else 'ies'} in {elapsed:.1f} s")
    for h in header:
        table.add_column(h, justify="right" if h != "policy" else "left")
    for r in rows:
        table.add_row(*r)
    console.print(table)
    if out:
        console.print(f"summary.json, CSVs and charts in {out}")
    bad = sum(s["violations"] for s in summaries)
    if bad:
        console.print(f"[red]{bad} invariant violations[/red]")
        raise typer.Exit(1)

# Options shared by `sim run` and `sim compare`.
JOBS = typer.Option(10_000, help="synthetic: number of jobs")
NODES = typer.Option(512, help="synthetic: 8-GPU nodes")
LOAD = typer.Option(0.8, help="synthetic: offered load")
START = typer.Option(None, help="philly: first submission day YYYY-mm-dd")
END = typer.Option(None, help="philly: day after the last")
ADD_NODES = typer.Option(0, help="what-if: extra 8-GPU nodes")
QUOTA = typer.Option([], help="what-if: TENANT=GPUS nominal quota, repeatable")
ARRIVAL_SCALE = typer.Option(1.0, help="what-if: arrivals this many times as fast")
TICK = typer.Option(60.0, help="scheduling cycle at most every N virtual seconds (0: every change)")
FAILURES = typer.Option(False, help="node failures at Llama 3 rates")
LEMONS = typer.Option(0.0, help="share of lemon nodes (10x failure rate)")
CHECKPOINT = typer.Option(3600.0, help="checkpoint interval (s)")
BORROWING = typer.Option(None, "--borrowing/--no-borrowing", help="default: off for philly, on otherwise")
OUT = typer.Option(None, help="folder for summary.json, CSVs and PNG charts")
CHECK_EVERY = typer.Option(0, help="check invariants every N cycles (0: never)")
LIMIT = typer.Option(None, help="philly: only the first N jobs")


@sim_app.command("run")
def run(
    policy: str = typer.Option("trainyard", help="trainyard, fifo, sjf or slurm"),
    workload: str = WORKLOAD, traces: str = TRACES,
    jobs: int = JOBS,
    nodes: int = NODES,
    seed: int = 0, load: float = LOAD,
    start: str = START,
    end: str = END,
    add_nodes: int = ADD_NODES,
    quota: list[str] = QUOTA,
    arrival_scale: float = ARRIVAL_SCALE,
    tick: float = TICK,
    failures: bool = FAILURES,
    lemons: float = LEMONS,
    checkpoint: float = CHECKPOINT,
    borrowing: bool = BORROWING,
    out: str = OUT,
    check_every: int = CHECK_EVERY,
    limit: int = LIMIT,
    as_json: bool = typer.Option(False, "--json", help="print summary JSON instead of a table"),
) -> None:
    """Simulate one policy."""
    if as_json:
        from trainyard.sim import FailureModel, Scenario
        from trainyard.sim.failures import NO_FAILURES
        from trainyard.sim.report import summarise
        from trainyard.sim.scenarios import build, parse_quotas, run_policies

        w, n = build(workload, traces, jobs, nodes, seed, load, start, end, add_nodes, parse_quotas(quota),
                     arrival_scale, limit)
        model = FailureModel(lemon_fraction=lemons, checkpoint_interval_s=checkpoint) if failures else NO_FAILURES
        borrow = borrowing if borrowing is not None else workload != "philly"
        scenario = Scenario(tick_s=tick, seed=seed, failures=model, borrowing=borrow, check_every=check_every,
                            record_events=False)
        typer.echo(json.dumps(summarise(run_policies(w, n, [policy], scenario)[0]), indent=2))
        return
    _run([policy], workload, traces, jobs, nodes, seed, load, start, end, add_nodes, quota, arrival_scale, tick,
         failures, lemons, checkpoint, borrowing, out, check_every, limit)


@sim_app.command("compare")
def compare(
    policies: str = typer.Option("trainyard,fifo,sjf,slurm", help="comma-separated policies"),
    workload: str = WORKLOAD, traces: str = TRACES,
    jobs: int = JOBS,
    nodes: int = NODES,
    seed: int = 0, load: float = LOAD,
    start: str = START,
    end: str = END,
    add_nodes: int = ADD_NODES,
    quota: list[str] = QUOTA,
    arrival_scale: float = ARRIVAL_SCALE,
    tick: float = TICK,
    failures: bool = FAILURES,
    lemons: float = LEMONS,
    checkpoint: float = CHECKPOINT,
    borrowing: bool = BORROWING,
    out: str = OUT,
    check_every: int = CHECK_EVERY,
    limit: int = LIMIT,
) -> None:
    """Simulate several policies on the same workload and print them side by side."""
    names = [p.strip() for p in policies.split(",") if p.strip()]
    _run(names, workload, traces, jobs, nodes, seed, load, start, end, add_nodes, quota, arrival_scale, tick,
         failures, lemons, checkpoint, borrowing, out, check_every, limit)
