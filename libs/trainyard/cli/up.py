"""``trainyard up``: the whole stack on this machine until Ctrl-C, SIGTERM or SIGHUP."""

from __future__ import annotations

import signal

import typer
from rich.console import Console

console = Console()
err_console = Console(stderr=True)

DataDir = typer.Option(".trainyard", "--data-dir", envvar="TRAINYARD_DATA_DIR", help="Where `up` keeps its state.")


MAX_NODES = 1024  # emulated nodes one machine runs (each heartbeats and reports telemetry)
MAX_AGENTS = 64  # node agents one machine runs (a process each)


def up(
    data_dir: str = DataDir,
    agents: int = typer.Option(
        4, min=0, max=MAX_AGENTS, help="Node agents that run jobs for real, one node each (fake GPUs unless --nvml)."
    ),
    agent_gpus: int = typer.Option(8, min=1, max=72, help="Fake GPUs per agent."),
    nvml: bool = typer.Option(
        False, "--nvml", help="One agent on this machine's own GPUs (NVML) instead of fake ones."
    ),
    nodes: int = typer.Option(0, min=0, max=MAX_NODES, help="Emulated GPU nodes, for load tests (pretend runs)."),
    gpus: int = typer.Option(8, min=1, max=72, help="GPUs per emulated node."),
    racks: int = typer.Option(2, min=1, max=MAX_NODES, help="Racks the nodes are spread over (at most one per node)."),
    http_port: int = typer.Option(
        0, min=0, max=65_535, help="REST port (default: the one kept from the last start, else a free one)."
    ),
    grpc_port: int = typer.Option(
        0, min=0, max=65_535, help="gRPC port (default: kept from the last start, else free)."
    ),
    nats_port: int = typer.Option(
        0, min=0, max=65_535, help="NATS port (default: kept from the last start, else free)."
    ),
    redis_port: int = typer.Option(
        0, min=0, max=65_535, help="Redis port (default: kept from the last start, else free)."
    ),
    portal: list[str] = typer.Option(
        [], "--portal", help="A tenant whose submission portal gets a NATS user (may repeat)."
    ),
    nats_cluster: int = typer.Option(
        1, "--nats-cluster", help="NATS nodes: 1, or a cluster of 3 (or 5) keeping 3 replicas of every stream."
    ),
    nats_sync: str = typer.Option(
        "",
        "--nats-sync",
        help="JetStream sync_interval: always (fsync before each ack), default (every 2 min) "
        "or a duration such as 1s. Default: always on one node, default in a cluster (docs/reliability.md).",
    ),
) -> None:
    """Start NATS, Redis, every service, node agents that run jobs for real (and
    emulated nodes with --nodes) and the gateway, until Ctrl-C, SIGTERM or SIGHUP
    (closing the terminal), which stop all of them."""
    from trainyard.cli.settings import cli_settings
    from trainyard.local import LocalStack, PortError, StackConfig, StackRunning
    from trainyard.local.servers import ServerError
    from trainyard.local.supervisor import Supervisor

    if nvml:
        agents, agent_gpus = 1, 0
    if agents + nodes == 0:
        _say("[red]error:[/red] no nodes: give --agents N (real processes) or --nodes N (emulated)", err=True)
        raise typer.Exit(2)
    racks = min(racks, max(nodes, agents))  # every rack holds a node: `--nodes 1` runs in one rack
    config = StackConfig(
        data_dir=data_dir,
        nodes=nodes,
        agents=agents,
        agent_gpus=agent_gpus,
        gpus_per_node=gpus,
        racks=racks,
        http_port=http_port,
        grpc_port=grpc_port,
        nats_port=nats_port,
        redis_port=redis_port,
        ledger_url=cli_settings().given("ledger_url"),
        portals=portal,
        nats_cluster=nats_cluster,
        nats_sync=nats_sync,
    )
    try:
        stack = LocalStack(config, progress=lambda line: _say(f"  {line}"))
    except ValueError as err:
        _say(f"[red]error:[/red] {err}", err=True)
        raise typer.Exit(2) from err

    def _stop(signum: int, _frame: object) -> None:
        if not stack.stopping.is_set():
            _say(f"{signal.Signals(signum).name}: stopping the stack...")
        stack.request_stop()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _stop)
    try:
        _say(f"Starting Trainyard from {stack.data_dir}")
        try:
            stack.start()
        except (StackRunning, PortError, ServerError) as err:
            _say(f"[red]error:[/red] {err}", err=True)
            raise typer.Exit(1) from err
        if not stack.stopping.is_set():
            _print_banner(stack, nodes, gpus, racks, agents, agent_gpus)
            _remember(stack.api_url, stack.data_dir)
        # Every process, nats-server and Redis included, restarts with its own
        # backoff; the backoff resets after a healthy minute.
        Supervisor(stack, say=lambda line: _say(f"[yellow]{line}[/yellow]", err=True)).run(stack.stopping)
    finally:
        stack.stop()
        if stack.procs or stack.nats:
            _say("stopped every process of the stack")


def _say(text: str, err: bool = False, markup: bool = True) -> None:
    """Print, ignoring a terminal that has gone away (SIGHUP)."""
    try:
        (err_console if err else console).print(text, markup=markup, highlight=markup)
    except OSError:
        pass


def _remember(api_url: str, data_dir: object) -> None:
    """Name this stack in the per-user config, so the CLI finds it from any directory (docs/cli.md)."""
    from trainyard.cli.discovery import remember_stack

    try:
        path = remember_stack(api_url, str(data_dir))
    except OSError as err:  # a read-only home: the CLI still finds the stack from here and below
        _say(f"[yellow]note:[/yellow] cannot write the per-user config ({err})", err=True)
        return
    _say(f"  CLI config       {path}  (the trainyard command finds this stack from any directory)")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def _cluster_line(nodes: int, gpus: int, racks: int, agents: int, agent_gpus: int) -> str:
    """What the stack's cluster is made of, e.g. '4 agents x 8 fake GPUs in 2 racks'."""
    parts = []
    if agents:
        what = f"{_plural(agent_gpus, 'fake GPU')}" if agent_gpus else "this machine's GPUs (NVML)"
        parts.append(f"{_plural(agents, 'node agent')} x {what} (jobs run for real)")
    if nodes:
        parts.append(f"{_plural(nodes, 'emulated node')} x {_plural(gpus, 'GPU')}")
    return " + ".join(parts) + f" in {_plural(racks, 'rack')}"


def _print_banner(stack, nodes: int, gpus: int, racks: int, agents: int, agent_gpus: int) -> None:  # type: ignore[no-untyped-def]
    from trainyard.redaction import redact

    assert stack.nats and stack.redis
    _say("[bold green]Trainyard is up[/bold green]")
    _say(f"  console          {stack.api_url}/  (log in with the admin token below)")
    _say(f"  REST API + docs  {stack.api_url}  ({stack.api_url}/docs)")
    _say(f"  gRPC             127.0.0.1:{stack.grpc_port}")
    _say(f"  NATS JetStream   {redact(stack.nats_url)}")
    size = len(stack.nats_nodes)
    shape = "one node" if size == 1 else f"a cluster of {size} nodes, {stack.nats_replicas} replicas of every stream"
    _say(f"  NATS durability  {shape}; sync_interval {stack.nats_sync}")
    _say(f"  Redis            {redact(stack.redis.url)}")
    if stack.credentials is not None:  # passwords stay in the 0600 file, never on the terminal or in a log
        _say(
            f"  bus users        {stack.data_dir / 'bus' / 'credentials.json'}  (one per service and admin's, "
            "for NATS and Redis; see docs/security.md)"
        )
    ports = ", ".join(f"{name} {port}" for name, port in stack.metrics_ports.items())
    _say(f"  metrics          127.0.0.1 ports: {ports}; gateway {stack.api_url}/metrics (operator token)")
    _say(f"  ledger           {redact(stack.ledger_url)}")  # a database URL may carry its password
    _say(f"  logs             {stack.data_dir / 'logs'}")
    _say(f"  ports kept in    {stack.data_dir / 'ports.json'}")
    _say(f"  cluster          {_cluster_line(nodes, gpus, racks, agents, agent_gpus)}")
    token_file = stack.data_dir / "admin-token"
    kept = "created now" if stack.admin_token_created else "kept from the last start"
    _say(f"  admin token      {token_file}  ({kept}; the CLI reads it by itself)")
    _say("Use the API with it:", markup=False)
    _say(f"  export TRAINYARD_TOKEN=$(cat {token_file})", markup=False)
    _say(f'  curl -H "Authorization: Bearer $TRAINYARD_TOKEN" {stack.api_url}/v1/jobs', markup=False)
    _say("  trainyard auth token create --name alice --role researcher --tenant acme   # a token per person")
    _say(
        "Try: trainyard submit --tenant acme --gpus 2 -- python3 -c \"import os; print('rank', os.environ['RANK'])\""
        "   then trainyard logs <job-id>   (Ctrl-C stops)",
        markup=False,
    )
