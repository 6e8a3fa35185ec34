"""``trainyard sim ...``: the discrete-event simulator.

``run`` and ``compare`` simulate policies on a workload (Philly, a synthetic
mix or a trace file, docs/traces.md) and print one row per policy; ``convert``
writes the Philly trace in the trace format.  Bad values exit with code 2 and a
message that says what to fix (with ``--json``: ``{"error": "..."}`` on stdout).
While policies run, a progress line per policy goes to stderr.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from typer.core import TyperCommand

try:  # typer vendors click from 0.25 on
    from typer._click.exceptions import UsageError
except ImportError:  # pragma: no cover - older typer on plain click
    from click.exceptions import UsageError

sim_app = typer.Typer(help="Replay cluster traces through the scheduling core.", no_args_is_help=True)
convert_app = typer.Typer(help="Write public traces in the trace format (docs/traces.md).", no_args_is_help=True)
sim_app.add_typer(convert_app, name="convert")


class JsonErrors(TyperCommand):
    """A command whose bad options are reported as ``{"error": ...}`` when ``--json`` is given."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        as_json = "--json" in args
        try:
            return super().parse_args(ctx, args)
        except UsageError as e:
            if not as_json:
                raise
            typer.echo(json.dumps({"error": e.format_message()}))
            raise typer.Exit(2) from None


def _positive(value: float | None) -> float | None:
    if value is not None and not value > 0:
        raise typer.BadParameter(f"{value:g} is not above 0")
    return value


class ProgressLine:
    """``policy: done/total jobs, elapsed`` on stderr, rewritten in place on a terminal, at most every ``every`` s."""

    def __init__(self, stream: Any = None, every: float | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.every = every if every is not None else (0.25 if self.tty else 5.0)
        self.started: dict[str, float] = {}
        self.finished: set[str] = set()
        self.last = 0.0

    def __call__(self, policy: str, done: int, total: int) -> None:
        now = time.perf_counter()
        if policy not in self.started:
            self.started[policy] = now
            self._write(f"{policy}: started, {total:,} jobs", final=not self.tty)
            self.last = now
            return
        if policy in self.finished:
            return
        elapsed = now - self.started[policy]
        if done >= total:
            self.finished.add(policy)
            self._write(f"{policy}: finished {total:,} jobs in {elapsed:.1f} s", final=True)
        elif now - self.last >= self.every:
            self.last = now
            self._write(f"{policy}: {done:,}/{total:,} jobs done, {elapsed:.1f} s", final=not self.tty)

    def _write(self, line: str, final: bool) -> None:
        if self.tty:
            self.stream.write("\r\x1b[K" + line + ("\n" if final else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def _fail(message: str, as_json: bool, console: Console) -> None:
    if as_json:
        typer.echo(json.dumps({"error": message}))
    else:
        console.print(f"[red]error:[/red] {escape(message)}")
    raise typer.Exit(2)


def _check_out(out: str, as_json: bool, console: Console) -> None:
    """``--out`` as a folder the results can be written to, made if missing; else exit 2 saying why."""
    folder = Path(out)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        _fail(f"--out {out} is a file; give a folder for the results", as_json, console)
    except OSError as e:
        _fail(f"--out {out}: cannot make a folder there ({e.strerror or e})", as_json, console)
    if not os.access(folder, os.W_OK | os.X_OK):
        _fail(f"--out {out}: the folder is not writable", as_json, console)


def _load(value: float) -> str:
    return "n/a (every job arrives at once)" if value == float("inf") else f"{value:.3f}"


def _run(policies: list[str], o: dict[str, Any], as_json: bool, single: bool = False) -> None:
    from trainyard.sim import FailureModel, Scenario
    from trainyard.sim.failures import NO_FAILURES
    from trainyard.sim.report import comparison_rows, summarise, write_outputs
    from trainyard.sim.scenarios import parse_quotas, prepare, run_partitioned, run_policies
    from trainyard.sim.traces import TraceError

    console = Console()
    if not console.is_terminal:
        console = Console(width=200)  # piped or captured: keep the table whole
    info = Console(stderr=True, width=200) if as_json else console  # JSON keeps stdout for the document
    if not policies:
        _fail("no policy named; give --policies, e.g. trainyard,fifo", as_json, console)
    try:
        from trainyard.sim.policies import policy_named

        for name in policies:
            policy_named(name)
        plan = prepare(
            o["workload"],
            o["traces"],
            o["jobs"],
            o["nodes"],
            o["seed"],
            o["load"],
            o["start"],
            o["end"],
            o["add_nodes"],
            parse_quotas(o["quota"]),
            o["arrival_scale"],
            o["limit"],
            trace=o["trace"],
            nodes_file=o["nodes_file"],
            target_load=o["target_load"],
            partition=o["partition_by_tenant"],
        )
    except (TraceError, ValueError, OSError) as e:
        _fail(str(e), as_json, console)
    if o["out"]:
        _check_out(o["out"], as_json, console)  # before the run, not after it: a run is minutes of work
    w = plan.workload
    model = (
        FailureModel(lemon_fraction=o["lemons"], checkpoint_interval_s=o["checkpoint"])
        if o["failures"]
        else NO_FAILURES
    )
    # Philly's VCs were dedicated partitions: no borrowing unless asked for.
    borrow = o["borrowing"] if o["borrowing"] is not None else (o["workload"] != "philly" or bool(o["trace"]))
    if plan.partitioned:
        borrow = False
    scenario = Scenario(
        tick_s=o["tick"],
        seed=o["seed"],
        failures=model,
        borrowing=borrow,
        check_every=o["check_every"],
        record_events=False,
    )
    where = (
        f"{len({j.tenant for j in w.jobs})} dedicated partitions" if plan.partitioned else f"{len(plan.nodes):,} nodes"
    )
    info.print(
        f"{escape(w.source)}: {len(w.jobs):,} jobs on {where}, {plan.gpus:,} {plan.nodes[0].gpu_type} GPUs, "
        f"borrowing={'on' if borrow else 'off'}"
    )
    moved = o["target_load"] is not None or o["arrival_scale"] != 1.0
    info.print(
        f"offered load: {_load(plan.load_before)}"
        + (f" -> {_load(plan.load_after)}" if moved else "")
        + " (GPU-seconds demanded / (cluster GPUs x submission span))"
    )
    if w.rounded:
        info.print(f"{w.rounded:,} fractional GPU requests rounded up to whole GPUs")
    t0 = time.perf_counter()
    progress = ProgressLine()
    try:
        if plan.partitioned:
            summaries = run_partitioned(w, policies, scenario, progress)
            sims = []
        else:
            sims = run_policies(w, plan.nodes, policies, scenario, progress)
            summaries = [summarise(s) for s in sims]
    except ValueError as e:
        _fail(str(e), as_json, console)
    elapsed = time.perf_counter() - t0
    if o["out"]:
        try:
            if sims:
                summaries = write_outputs(sims, o["out"])["summaries"]
            else:
                (Path(o["out"]) / "summary.json").write_text(json.dumps(summaries, indent=2))
        except OSError as e:
            _fail(f"--out {o['out']}: cannot write the results there ({e.strerror or e})", as_json, console)
    for s in summaries:
        s.update(
            offered_load_before=plan.load_before if plan.load_before != float("inf") else None,
            offered_load=plan.load_after if plan.load_after != float("inf") else None,
            rounded_gpu_requests=w.rounded,
        )
    bad = sum(s["violations"] for s in summaries)
    if as_json:
        typer.echo(json.dumps(summaries[0] if single else summaries, indent=2))
        if bad:
            raise typer.Exit(1)
        return
    header, rows = comparison_rows(summaries)
    table = Table(title=f"{len(policies)} polic{'y' if len(policies) == 1 else 'ies'} in {elapsed:.1f} s")
    for h in header:
        table.add_column(h, justify="right" if h != "policy" else "left")
    for r in rows:
        table.add_row(*r)
    console.print(table)
    if plan.partitioned:
        _partition_table(console, summaries)
    rejected = max(s["rejected"] for s in summaries)  # the same for every policy: decided on arrival
    if rejected:
        console.print(
            f"[yellow]{rejected:,} job{'s' if rejected != 1 else ''} rejected on arrival[/yellow]: more GPUs of "
            "its type than its queue may ever hold or the cluster has; --out lists them in jobs_<policy>.csv"
        )
    checked = all(s.get("invariants_checked", True) for s in summaries)
    console.print(
        f"invariants: checked every {o['check_every']} cycles, {bad} broken"
        if checked
        else "invariants: not checked (--check-every N checks them every N cycles)"
    )
    if o["out"]:
        console.print(f"summary.json{', CSVs and charts' if sims else ''} in {escape(o['out'])}")
    if bad:
        console.print(f"[red]{bad} invariant violations[/red]")
        raise typer.Exit(1)


def _partition_table(console: Console, summaries: list[dict]) -> None:
    table = Table(title="per partition: avg JCT / avg wait (h)")
    table.add_column("tenant", justify="left")
    for s in summaries:
        table.add_column(s["policy"], justify="right")
    for tenant in sorted(summaries[0]["partitions"]):
        parts = [s["partitions"][tenant] for s in summaries]
        cells = [f"{p['jct_avg_s'] / 3600:.2f} / {p['wait_avg_s'] / 3600:.2f}" for p in parts]
        table.add_row(tenant, *cells)
    console.print(table)


# Options shared by `sim run` and `sim compare`.
WORKLOAD = typer.Option("philly", help="philly (the trace) or synthetic (today's mix); see also --trace")
TRACES = typer.Option(None, help="traces folder (default: $TRAINYARD_TRACES, else the repository's traces/)")
TRACE = typer.Option(None, "--trace", help="a trace file (.csv or .parquet, docs/traces.md) instead of --workload")
NODES_FILE = typer.Option(None, "--nodes-file", help="a node list (.csv or .parquet): the cluster, exactly")
JOBS = typer.Option(10_000, min=1, max=10_000_000, help="synthetic: number of jobs")
NODES = typer.Option(512, min=1, max=65_536, help="synthetic or --trace without --nodes-file: 8-GPU nodes")
SEED = typer.Option(0, min=0, help="random seed (synthetic mix, failures)")
LOAD = typer.Option(0.8, callback=_positive, help="synthetic: offered load")
START = typer.Option(None, help="philly: first submission day YYYY-mm-dd")
END = typer.Option(None, help="philly: day after the last")
ADD_NODES = typer.Option(0, min=0, max=65_536, help="what-if: extra 8-GPU nodes")
QUOTA = typer.Option([], help="what-if: TENANT=GPUS nominal quota, repeatable")
ARRIVAL_SCALE = typer.Option(1.0, callback=_positive, help="what-if: arrivals this many times as fast")
TARGET_LOAD = typer.Option(
    None,
    "--target-load",
    callback=_positive,
    help="move arrivals so that GPU-seconds demanded / (cluster GPUs x span) is this",
)
PARTITION = typer.Option(
    False, "--partition-by-tenant", help="each tenant alone on dedicated nodes of its quota's size, no borrowing"
)
TICK = typer.Option(
    60.0, min=0.0, max=86_400.0, help="scheduling cycle at most every N virtual seconds (0: every change)"
)
FAILURES = typer.Option(False, help="node failures at Llama 3 rates")
LEMONS = typer.Option(0.0, min=0.0, max=1.0, help="share of lemon nodes (10x failure rate), 0..1")
CHECKPOINT = typer.Option(3600.0, min=0.0, help="checkpoint interval (s); 0: no work lost")
BORROWING = typer.Option(None, "--borrowing/--no-borrowing", help="default: off for philly, on otherwise")
OUT = typer.Option(None, help="folder for summary.json, CSVs and PNG charts")
CHECK_EVERY = typer.Option(0, min=0, help="check invariants every N cycles (0: never)")
LIMIT = typer.Option(None, min=1, help="philly: only the first N jobs")
JSON = typer.Option(False, "--json", help='print the summaries as JSON (errors as {"error": ...})')


@sim_app.command("run", cls=JsonErrors)
def run(
    policy: str = typer.Option("trainyard", help="trainyard, fifo, sjf, sjf-backfill, slurm or tiresias"),
    workload: str = WORKLOAD,
    traces: str = TRACES,
    trace: str = TRACE,
    nodes_file: str = NODES_FILE,
    jobs: int = JOBS,
    nodes: int = NODES,
    seed: int = SEED,
    load: float = LOAD,
    start: str = START,
    end: str = END,
    add_nodes: int = ADD_NODES,
    quota: list[str] = QUOTA,
    arrival_scale: float = ARRIVAL_SCALE,
    target_load: float = TARGET_LOAD,
    partition_by_tenant: bool = PARTITION,
    tick: float = TICK,
    failures: bool = FAILURES,
    lemons: float = LEMONS,
    checkpoint: float = CHECKPOINT,
    borrowing: bool = BORROWING,
    out: str = OUT,
    check_every: int = CHECK_EVERY,
    limit: int = LIMIT,
    as_json: bool = JSON,
) -> None:
    """Simulate one policy."""
    options = dict(locals())
    _run([policy.strip()], options, options.pop("as_json"), single=True)


@sim_app.command("compare", cls=JsonErrors)
def compare(
    policies: str = typer.Option("trainyard,fifo,sjf,slurm", help="comma-separated policies"),
    workload: str = WORKLOAD,
    traces: str = TRACES,
    trace: str = TRACE,
    nodes_file: str = NODES_FILE,
    jobs: int = JOBS,
    nodes: int = NODES,
    seed: int = SEED,
    load: float = LOAD,
    start: str = START,
    end: str = END,
    add_nodes: int = ADD_NODES,
    quota: list[str] = QUOTA,
    arrival_scale: float = ARRIVAL_SCALE,
    target_load: float = TARGET_LOAD,
    partition_by_tenant: bool = PARTITION,
    tick: float = TICK,
    failures: bool = FAILURES,
    lemons: float = LEMONS,
    checkpoint: float = CHECKPOINT,
    borrowing: bool = BORROWING,
    out: str = OUT,
    check_every: int = CHECK_EVERY,
    limit: int = LIMIT,
    as_json: bool = JSON,
) -> None:
    """Simulate several policies on the same workload, one after another, and print them side by side."""
    options = dict(locals())
    names = [p.strip() for p in options.pop("policies").split(",") if p.strip()]
    _run(names, options, options.pop("as_json"))


@convert_app.command("philly")
def convert_philly(
    out: str = typer.Option(..., "--out", help="trace file to write (.csv or .parquet)"),
    nodes_out: str = typer.Option(None, "--nodes-out", help="node list to write (.csv or .parquet)"),
    traces: str = TRACES,
    start: str = START,
    end: str = END,
    limit: int = LIMIT,
) -> None:
    """The Philly jobs (Jeon et al., ATC'19; CC BY 4.0) as a trace file, and their cluster as a node list."""
    from trainyard.sim.trace_writers import convert_philly as convert
    from trainyard.sim.traces import TraceError

    console = Console()
    try:
        w, n = convert(out, nodes_out, traces, start, end, limit)
    except (TraceError, ValueError, OSError) as e:
        _fail(str(e), False, console)
    console.print(f"{len(w.jobs):,} jobs of {len(w.quotas)} VCs written to {escape(out)}")
    if nodes_out:
        console.print(f"{n:,} nodes x 8 GPUs written to {escape(nodes_out)}")
    flags = " ".join(f"--quota {t}={g}" for t, g in sorted(w.quotas.items()))
    console.print(f"Philly's VC sizes as quotas (else split by GPU-time): {flags}", soft_wrap=True)
