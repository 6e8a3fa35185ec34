"""``trainyard``: run the local stack, submit and watch jobs, inspect nodes and usage."""

from __future__ import annotations

import asyncio
import json
import sys
import time

import msgspec
import typer
from rich.console import Console
from rich.table import Table

from trainyard.cli.auth import auth_app
from trainyard.cli.client import ApiError, Client, use_token
from trainyard.cli.config import config_app, stack_state
from trainyard.cli.dlq import dlq_app
from trainyard.cli.finance import export_app, report_app
from trainyard.cli.logs import logs
from trainyard.cli.nodes import agent_command, emulate_inject, node_app
from trainyard.cli.sim import sim_app
from trainyard.cli.submit import submit
from trainyard.cli.traces import traces_app
from trainyard.cli.up import up

app = typer.Typer(help="Trainyard: the operating system for large GPU training clusters.", no_args_is_help=True)
events_app = typer.Typer(help="The event vocabulary.", no_args_is_help=True)
emulate_app = typer.Typer(help="Emulated GPU nodes.", no_args_is_help=True)
admin_app = typer.Typer(help="Operator maintenance.", no_args_is_help=True)
app.add_typer(events_app, name="events")
app.add_typer(emulate_app, name="emulate")
app.add_typer(admin_app, name="admin")
app.add_typer(node_app, name="node")
app.add_typer(export_app, name="export")
app.add_typer(report_app, name="report")
app.add_typer(sim_app, name="sim")
app.add_typer(traces_app, name="traces")
app.add_typer(config_app, name="config")
app.add_typer(auth_app, name="auth")
app.add_typer(dlq_app, name="dlq")
app.command("agent")(agent_command)
app.command("submit")(submit)
app.command("logs")(logs)
app.command("up")(up)
emulate_app.command("inject")(emulate_inject)

console = Console()
err_console = Console(stderr=True)

DataDir = typer.Option(".trainyard", "--data-dir", envvar="TRAINYARD_DATA_DIR", help="Where `up` keeps its state.")
ApiUrl = typer.Option(None, "--api-url", help="Gateway URL (default: the running `trainyard up`, else :8080).")


@app.callback()
def credentials(
    token: str | None = typer.Option(
        None, "--token", envvar="TRAINYARD_TOKEN", help="API token or JWT (default: the local stack's admin token)."
    ),
) -> None:
    """Trainyard: the operating system for large GPU training clusters."""
    use_token(token)


def _client(api_url: str | None, data_dir: str) -> Client:
    return Client.for_cli(api_url, data_dir)


def _call(fn, *args, **kwargs):  # type: ignore[no-untyped-def]
    try:
        return fn(*args, **kwargs)
    except ApiError as err:
        err_console.print(f"[red]error:[/red] {err}")
        raise typer.Exit(1) from err


def _age(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m"
    if seconds < 172_800:
        return f"{seconds / 3600:.0f}h"
    return f"{seconds / 86400:.0f}d"


# --- the local stack ---


# --- jobs ---


@app.command()
def jobs(
    tenant: str | None = typer.Option(None, help="Only this tenant's jobs."),
    status: str | None = typer.Option(None, help="Only jobs in this status."),
    limit: int = typer.Option(50, help="At most this many (newest first)."),
    as_json: bool = typer.Option(False, "--json"),
    api_url: str | None = ApiUrl,
    data_dir: str = DataDir,
) -> None:
    """List jobs, newest first."""
    params = {k: v for k, v in {"tenant": tenant, "status": status, "limit": limit}.items() if v is not None}
    rows = _call(_client(api_url, data_dir).request, "GET", "/v1/jobs", params=params)
    items = rows["jobs"] if isinstance(rows, dict) else rows
    if as_json:
        console.print_json(data=items)
        return
    table = Table("job", "tenant", "queue", "GPUs", "status", "run", "age", "why waiting")
    table.columns[0].no_wrap = True
    now = time.time()
    for j in items:
        waiting = (j.get("reason") or "") if j.get("status") == "pending" else ""
        age = _age(now - j["submitted_at"]) if j.get("submitted_at") else "-"
        table.add_row(
            j["job_id"],
            j["tenant"],
            j.get("queue") or "",
            str(j.get("gpus", 0)),
            j["status"],
            str(j.get("attempt", 0)),
            age,
            waiting,
        )
    console.print(table)


@app.command()
def job(
    job_id: str, as_json: bool = typer.Option(False, "--json"), api_url: str | None = ApiUrl, data_dir: str = DataDir
) -> None:
    """Show one job: status, why it waits, where it runs."""
    j = _call(_client(api_url, data_dir).request, "GET", f"/v1/jobs/{job_id}")
    if as_json:
        console.print_json(data=j)
        return
    spec = j.get("spec") or {}
    queue = j.get("queue") or spec.get("queue") or "-"
    if j.get("status") == "rejected":
        console.print(f"[bold]{j['job_id']}[/bold]  [red]rejected[/red]  tenant={j['tenant']} queue={queue}")
    else:
        console.print(
            f"[bold]{j['job_id']}[/bold]  {j['status']}  tenant={j['tenant']} queue={queue} "
            f"gpus={j.get('gpus')} attempt={j.get('attempt')} run={j.get('run_id') or '-'}"
        )
    if j.get("status") == "pending" and j.get("reason"):
        console.print(f"  waiting: {j['reason']} (position {j.get('position') or '?'})")
    if j.get("errors"):
        for e in j["errors"]:
            console.print(f"  [red]{e['field']}[/red]: {e['message']}")
    for r in j.get("placement") or []:
        console.print(f"  rank {r['rank']:>4}  {r['role']}[{r['replica']}]  {r['node_id']}  GPUs {r['gpus']}")


@app.command()
def cancel(job_id: str, api_url: str | None = ApiUrl, data_dir: str = DataDir) -> None:
    """Cancel a job that has not finished."""
    _call(_client(api_url, data_dir).request, "DELETE", f"/v1/jobs/{job_id}")
    console.print(f"cancel requested for {job_id}")


@app.command()
def nodes(as_json: bool = typer.Option(False, "--json"), api_url: str | None = ApiUrl, data_dir: str = DataDir) -> None:
    """List GPU nodes with their state and free GPUs."""
    rows = _call(_client(api_url, data_dir).request, "GET", "/v1/nodes")
    items = rows["nodes"] if isinstance(rows, dict) else rows
    if as_json:
        console.print_json(data=items)
        return
    table = Table("node", "state", "type", "GPUs", "free", "rack", "reason")
    for n in items:
        info = n.get("info") or {}
        table.add_row(
            n["node_id"],
            n["state"],
            info.get("gpu_type", ""),
            str(info.get("gpus", "")),
            str(len(n.get("free_gpus", []))),
            info.get("rack", ""),
            n.get("state_reason") or "",
        )
    console.print(table)


@app.command()
def usage(
    tenant: str | None = typer.Option(None, help="Only this tenant."),
    start: str | None = typer.Option(None, "--from", help="Start of the window (ISO date or time, UTC)."),
    end: str | None = typer.Option(None, "--to", help="End of the window (exclusive)."),
    group_by: str = typer.Option("tenant,gpu_type", help="Comma-separated: tenant, queue, gpu_type, job."),
    as_json: bool = typer.Option(False, "--json"),
    api_url: str | None = ApiUrl,
    data_dir: str = DataDir,
) -> None:
    """GPU usage from the accounting ledger (a researcher or tenant-admin token sees only its tenant's)."""
    params = {k: v for k, v in {"tenant": tenant, "from": start, "to": end, "group_by": group_by}.items() if v}
    rows = _call(_client(api_url, data_dir).request, "GET", "/v1/usage", params=params)
    items = rows["usage"] if isinstance(rows, dict) else rows
    if as_json:
        console.print_json(data=items)
        return
    table = Table(*(items[0].keys() if items else ["tenant", "gpu_seconds"]))
    for row in items:
        table.add_row(*(f"{v:,.3f}" if isinstance(v, float) else str(v) for v in row.values()))
    console.print(table)


@app.command()
def why(job_id: str, api_url: str | None = ApiUrl, data_dir: str = DataDir) -> None:
    """Why is this job pending, and where is it in line?"""
    from trainyard.core.reasons import REASON_TEXT, PendingReason

    j = _call(_client(api_url, data_dir).request, "GET", f"/v1/jobs/{job_id}")
    status = j["status"]
    if status != "pending":
        detail = {
            "rejected": "it was rejected",
            "admitted": "it is admitted and waiting for placement",
            "placed": "it is placed and starting",
            "running": "it is running",
        }.get(status, f"it is {status}")
        console.print(f"{job_id} is not waiting: {detail}.")
        for e in j.get("errors") or []:
            console.print(f"  [red]{e['field']}[/red]: {e['message']}")
        return
    reason = j.get("reason")
    try:
        text = REASON_TEXT[PendingReason(reason)]
    except ValueError:
        text = reason or "not yet considered by admission"
    position = f", position {j['position']} in line" if j.get("position") else ""
    console.print(f"{job_id} is pending: {text} ({reason or 'new'}{position}).")
    if j.get("expected_start"):
        console.print(f"  expected to start around {time.strftime('%H:%M:%S', time.localtime(j['expected_start']))}")


# --- events ---


@events_app.command("schema")
def events_schema() -> None:
    """Print the JSON Schema of every message a submission portal may publish."""
    from trainyard.events.jobs import IntakeCommand

    schema = msgspec.json.schema(IntakeCommand)
    schema["$comment"] = "Publish to trainyard.intake.<tenant> with header Nats-Msg-Id set to a unique id."
    sys.stdout.write(json.dumps(schema, indent=2) + "\n")


# --- emulator ---


@emulate_app.command("run")
def emulate_run(
    nodes: int = typer.Option(16, envvar="TRAINYARD_EMULATOR_NODES"),
    gpus: int = typer.Option(8, envvar="TRAINYARD_EMULATOR_GPUS"),
    racks: int = typer.Option(2, envvar="TRAINYARD_EMULATOR_RACKS"),
) -> None:
    """Run emulated GPU nodes against the NATS and Redis in TRAINYARD_* settings."""
    from trainyard.emulator import EmulatedCluster, default_topology
    from trainyard.runtime import Runtime, run_tasks, serve

    async def main(rt: Runtime) -> None:
        topology = default_topology(rt.settings.cluster, nodes=nodes, gpus=gpus, racks=racks)
        cluster = EmulatedCluster(rt.bus, rt.store, topology, heartbeat_interval_s=rt.settings.heartbeat_interval_s)
        await run_tasks(rt.stop, cluster.run(rt.stop))

    serve("emulator", main)


# --- admin ---


@admin_app.command("rebuild")
def admin_rebuild(data_dir: str = DataDir) -> None:
    """Throw away the Redis projections and rebuild them by replaying the streams: those of the installation
    TRAINYARD_NATS_URL and TRAINYARD_REDIS_URL name, else of the running `trainyard up`."""
    from trainyard.cli.settings import cli_settings
    from trainyard.runtime import close_runtime, open_runtime
    from trainyard.store import Projector

    settings = cli_settings()
    if not (settings.given("nats_url") and settings.given("redis_url")):
        state = stack_state(data_dir, "TRAINYARD_NATS_URL and TRAINYARD_REDIS_URL")
        settings = msgspec.structs.replace(settings, nats_url=state.nats_url, redis_url=state.redis_url)

    async def rebuild() -> None:
        rt = await open_runtime("admin", settings)
        try:
            await rt.store.flush()
            for stream in ("NODES", "JOBS"):
                projector = Projector(rt.bus, rt.store, stream)
                stop = asyncio.Event()
                task = asyncio.create_task(projector.run(stop))
                last = (await rt.bus.js.stream_info(stream)).state.last_seq
                await projector.wait_for(last, timeout=600)
                stop.set()
                await task
                console.print(f"{stream}: replayed through sequence {last}")
        finally:
            await close_runtime(rt)

    asyncio.run(rebuild())


if __name__ == "__main__":
    app()
