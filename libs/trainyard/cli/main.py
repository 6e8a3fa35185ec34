"""``trainyard``: run the local stack, submit and watch jobs, inspect nodes and usage."""

from __future__ import annotations

import json
import sys

import typer
from rich.console import Console

from trainyard.cli import coercion
from trainyard.cli.auth import auth_app
from trainyard.cli.client import use_token
from trainyard.cli.config import config_app
from trainyard.cli.dlq import dlq_app
from trainyard.cli.finance import export_app, report_app
from trainyard.cli.hints import HintingCommand, HintingGroup
from trainyard.cli.jobs import ApiUrl, DataDir, calling, cancel, job, jobs, request, why
from trainyard.cli.logs import logs
from trainyard.cli.nodes import agent_command, emulate_inject, node_app
from trainyard.cli.output import AsJson, Column, NoHeaders, Output, OutputOpt, chosen, print_items
from trainyard.cli.sim import sim_app
from trainyard.cli.submit import submit
from trainyard.cli.traces import traces_app
from trainyard.cli.up import up

HELP = (
    "Trainyard: the operating system for large GPU training clusters.\n\n"
    "List and show commands take -o table|wide|json|yaml|name and --no-headers; piped or redirected, "
    "tables are printed whole (`trainyard jobs | grep running`). The stack is found from any directory: "
    "--api-url, TRAINYARD_API_URL, a .trainyard here or above, then ~/.config/trainyard/config.toml."
)
# Plain help and errors: rich's help rendering imports Markdown and traceback support, which took
# longer than the rest of `trainyard --help` (docs/cli.md, bench/cli.py).
coercion.install()  # plain options converted without importing pydantic
app = typer.Typer(cls=HintingGroup, help=HELP, no_args_is_help=True, rich_markup_mode=None)
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
for command in (submit, jobs, job, logs, why, cancel, up):  # --help lists the everyday commands first
    app.command(cls=HintingCommand)(command)
app.command("agent")(agent_command)
emulate_app.command("inject")(emulate_inject)

console = Console()


@app.callback()
def credentials(
    token: str | None = typer.Option(
        None, "--token", envvar="TRAINYARD_TOKEN", help="API token or JWT (default: the local stack's admin token)."
    ),
) -> None:
    use_token(token)


# --- nodes and usage ---

NODE_COLUMNS = [
    Column("node", lambda n: n["node_id"]),
    Column("state", lambda n: n["state"]),
    Column("type", lambda n: (n.get("info") or {}).get("gpu_type", "")),
    Column("GPUs", lambda n: str((n.get("info") or {}).get("gpus", ""))),
    Column("free", lambda n: str(len(n.get("free_gpus", [])))),
    Column("rack", lambda n: (n.get("info") or {}).get("rack", "")),
    Column("block", lambda n: (n.get("info") or {}).get("block", ""), wide=True),
    Column("cluster", lambda n: (n.get("info") or {}).get("cluster", ""), wide=True),
    Column("reason", lambda n: n.get("state_reason") or ""),
]


@app.command()
def nodes(
    output: Output = OutputOpt,
    as_json: bool = AsJson,
    no_headers: bool = NoHeaders,
    api_url: str | None = ApiUrl,
    data_dir: str = DataDir,
) -> None:
    """List GPU nodes with their state and free GPUs (-o wide|json|yaml|name, --no-headers)."""
    items, _ = calling(api_url, data_dir, lambda client: client.walk("/v1/nodes", "nodes", {}, None))  # every page
    print_items(items, NODE_COLUMNS, chosen(output, as_json), no_headers)


@app.command()
def usage(
    tenant: str | None = typer.Option(None, help="Only this tenant."),
    start: str | None = typer.Option(None, "--from", help="Start of the window (ISO date or time, UTC)."),
    end: str | None = typer.Option(None, "--to", help="End of the window (exclusive)."),
    group_by: str = typer.Option("tenant,gpu_type", help="Comma-separated: tenant, queue, gpu_type, job."),
    output: Output = OutputOpt,
    as_json: bool = AsJson,
    no_headers: bool = NoHeaders,
    api_url: str | None = ApiUrl,
    data_dir: str = DataDir,
) -> None:
    """GPU usage from the accounting ledger (a researcher or tenant-admin token sees only its tenant's)."""
    params = {k: v for k, v in {"tenant": tenant, "from": start, "to": end, "group_by": group_by}.items() if v}
    rows = request(api_url, data_dir, "GET", "/v1/usage", params=params)
    items = rows["usage"] if isinstance(rows, dict) else rows
    keys = list(items[0].keys()) if items else ["tenant", "gpu_seconds"]
    columns = [Column(k, lambda row, k=k: f"{row[k]:,.3f}" if isinstance(row[k], float) else str(row[k])) for k in keys]
    print_items(items, columns, chosen(output, as_json), no_headers)


# --- events ---


@events_app.command("schema")
def events_schema() -> None:
    """Print the JSON Schema of every message a submission portal may publish."""
    import msgspec

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
    """Throw away the Redis projections and rebuild them by replaying the streams, JOBS from its newest snapshot in
    the ledger database on (TRAINYARD_LEDGER_URL, else the stack's): those of the installation TRAINYARD_NATS_URL and
    TRAINYARD_REDIS_URL name, else of the running `trainyard up`."""
    import asyncio

    import msgspec

    from trainyard.cli.config import stack_state
    from trainyard.cli.settings import cli_settings
    from trainyard.ledger.snapshots import SnapshotStore
    from trainyard.runtime import close_runtime, open_runtime
    from trainyard.store import Projector

    settings = cli_settings()
    ledger_url = settings.given("ledger_url")  # where the JOBS snapshot is; none given: the stack's, if any
    if not (settings.given("nats_url") and settings.given("redis_url")):
        state = stack_state(data_dir, "TRAINYARD_NATS_URL and TRAINYARD_REDIS_URL")
        ledger_url = ledger_url or state.ledger_url
        settings = msgspec.structs.replace(settings, nats_url=state.nats_url, redis_url=state.redis_url)

    async def rebuild() -> None:
        rt = await open_runtime("admin", settings)
        try:
            await rt.store.flush()
            for stream in ("NODES", "JOBS"):
                snapshots = SnapshotStore(ledger_url) if stream == "JOBS" and ledger_url else None
                projector = Projector(rt.bus, rt.store, stream, snapshots)
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
