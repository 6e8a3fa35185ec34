"""``trainyard node ...``, ``trainyard agent`` and ``trainyard emulate inject``:
operator commands for GPU nodes, the node agent, and fault injection into the
emulated cluster."""

from __future__ import annotations

import getpass
import json
import socket
import sys
import time

import typer
from rich.console import Console

from trainyard.cli.client import ApiError, Client
from trainyard.cli.config import stack_state
from trainyard.cli.output import AsJson, NoHeaders, Output, OutputOpt, chosen, print_shown, print_table
from trainyard.cli.settings import cli_settings

node_app = typer.Typer(help="Cordon, drain, uncordon and inspect GPU nodes.", no_args_is_help=True)

console = Console()
err_console = Console(stderr=True)

DataDir = typer.Option(".trainyard", "--data-dir", envvar="TRAINYARD_DATA_DIR", help="Where `up` keeps its state.")
ApiUrl = typer.Option(None, "--api-url", help="Gateway URL (default: the stack found from here; see docs/cli.md).")
Reason = typer.Option(..., "--reason", help="Why (recorded in the node's history and the audit stream).")


def _request(api_url: str | None, data_dir: str, method: str, path: str, **kwargs):  # type: ignore[no-untyped-def]
    """Call the gateway as the caller's token (recorded as who acted)."""
    try:
        return Client.for_cli(api_url, data_dir).request(method, path, **kwargs)
    except ApiError as err:
        err_console.print(f"[red]error:[/red] {err}")
        raise typer.Exit(1) from err


def _operator(name: str | None) -> str:
    if name:
        return name
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no login name (containers): say so
        return "unknown"


def _command(op: str, node_id: str, reason: str, api_url: str | None, data_dir: str) -> None:
    body = {"reason": reason}
    result = _request(api_url, data_dir, "POST", f"/v1/nodes/{node_id}/{op}", json=body)
    console.print(f"{op} of {node_id} accepted: {result['state']} -> {result['expected_state']}")


@node_app.command("cordon")
def cordon(node_id: str, reason: str = Reason, api_url: str | None = ApiUrl, data_dir: str = DataDir) -> None:
    """Stop placing new work on a node; its runs keep running."""
    _command("cordon", node_id, reason, api_url, data_dir)


@node_app.command("drain")
def drain(node_id: str, reason: str = Reason, api_url: str | None = ApiUrl, data_dir: str = DataDir) -> None:
    """Cordon a node and move its runs elsewhere (they are requeued at the head of their queues)."""
    _command("drain", node_id, reason, api_url, data_dir)


@node_app.command("uncordon")
def uncordon(node_id: str, reason: str = Reason, api_url: str | None = ApiUrl, data_dir: str = DataDir) -> None:
    """Return a node to service (also a lemon node, whose incident count starts afresh)."""
    _command("uncordon", node_id, reason, api_url, data_dir)


def _ts(value: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(value)) if value else "-"


@node_app.command("history")
def history(
    node_id: str,
    output: Output = OutputOpt,
    as_json: bool = AsJson,
    no_headers: bool = NoHeaders,
    api_url: str | None = ApiUrl,
    data_dir: str = DataDir,
) -> None:
    """A node's health state, current incident and history of transitions (-o json|yaml: the API's object)."""
    h = _request(api_url, data_dir, "GET", f"/v1/nodes/{node_id}/history")
    if print_shown(h, chosen(output, as_json), str(h["node_id"])):
        return
    lemon = "  [red]lemon[/red]" if h.get("lemon") else ""
    console.print(f"[bold]{h['node_id']}[/bold]  {h['state']} since {_ts(h['since'])}{lemon}  {h['reason']}")
    if h.get("remedy"):
        console.print(
            f"  remedy: {h['remedy']}  GPUs: {h.get('gpus') or '-'}  incidents: {len(h.get('incidents', []))}"
        )
    rows = [[_ts(e["at"]), e["from_state"], e["to_state"], e["cause"], e["detail"]] for e in h.get("history", [])]
    print_table(["at", "from", "to", "cause", "detail"], rows, no_headers)


# --- the node agent: registered as `trainyard agent` ---


def agent_command(
    node_id: str = typer.Option(socket.gethostname().split(".")[0], help="This node's id."),
    gpu_type: str | None = typer.Option(None, help="GPU type (default: from the first GPU's name)."),
    zone: str = typer.Option("z1"),
    block: str = typer.Option("b1"),
    rack: str = typer.Option("r1"),
    nvlink_domain: str | None = typer.Option(None),
    telemetry_interval: float = typer.Option(5.0, help="Seconds between GPU samples."),
    fake_gpus: int = typer.Option(0, help="Use N fake GPUs instead of NVML (tests and demos)."),
    probe: bool = typer.Option(False, "--probe", help="Print which NVML calls work on GPU 0 and exit."),
    state_dir: str = typer.Option(
        "/var/lib/trainyard/agent", "--state-dir", help="Where runs, logs and checkpoints are kept (survives restarts)."
    ),
    address: str | None = typer.Option(
        None, "--address", help="Where this node's processes are reached (default: 127.0.0.1 with a loopback bus)."
    ),
    run_as: str | None = typer.Option(None, "--run-as", help="Run every job process as this unprivileged user."),
    container_runtime: str | None = typer.Option(
        None,
        "--container-runtime",
        help="Command template for jobs with an image, e.g. "
        "'docker run --rm --gpus device={gpus} -v {workdir}:{workdir} -w {workdir} {env} {image}' (docs/execution.md).",
    ),
    log_max_bytes: int = typer.Option(
        64 * 1024 * 1024, "--log-max-bytes", min=4096, help="Rotate a rank's log file past this size."
    ),
) -> None:
    """Run the node agent: it executes the runs placed on this node and reports
    heartbeats, GPU telemetry, XIDs and checks, against TRAINYARD_* settings (NATS only)."""
    from trainyard.gpu import FakeGpuBackend, NvmlBackend, NvmlUnavailable

    if run_as is not None:
        import pwd

        try:
            pwd.getpwnam(run_as)
        except KeyError as err:
            err_console.print(f"[red]error:[/red] --run-as: no user {run_as!r} on this machine")
            raise typer.Exit(2) from err
    if container_runtime is not None:
        from trainyard.agent.processes import container_argv

        try:
            container_argv(container_runtime, "image", [0], "/work", {}, [])
        except (KeyError, IndexError, ValueError) as err:
            err_console.print(
                f"[red]error:[/red] --container-runtime: {err!r}; the placeholders are {{image}} {{gpus}} {{workdir}} {{env}}"
            )
            raise typer.Exit(2) from err
    try:
        backend = FakeGpuBackend(fake_gpus, clock=time.time) if fake_gpus else NvmlBackend()
    except NvmlUnavailable as err:
        err_console.print(f"[red]error:[/red] {err} (use --fake-gpus N to run without GPUs)")
        raise typer.Exit(2) from err
    if probe:
        report = backend.probe(0) if isinstance(backend, NvmlBackend) else {"backend": "fake: nothing to probe"}
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
        backend.close()
        return

    from trainyard.agent.running import RunningAgent, default_address, serve_agent
    from trainyard.domain.node import NodeInfo

    count = backend.device_count()
    name = gpu_type or (backend.sample(0).name or "unknown" if count else "none")

    async def make(bus, settings):  # type: ignore[no-untyped-def]
        info = NodeInfo(
            node_id=node_id,
            cluster=settings.cluster,
            gpu_type=name.replace(" ", "-"),
            gpus=count,
            zone=zone,
            block=block,
            rack=rack,
            nvlink_domain=nvlink_domain,
            address=address or default_address(settings.nats_url),
            executes=True,
        )
        options = {"run_as": run_as, "container_runtime": container_runtime, "log_max_bytes": log_max_bytes}
        return RunningAgent.build(
            bus,
            info,
            backend,
            state_dir,
            executor_options=options,
            heartbeat_interval_s=settings.heartbeat_interval_s,
            telemetry_interval_s=telemetry_interval,
        )

    serve_agent(make)


# --- fault injection: registered as `trainyard emulate inject` ---


def emulate_inject(
    node: str = typer.Option(..., "--node", help="Emulated node id, e.g. n12."),
    gpu: int = typer.Option(0, "--gpu", help="GPU index on the node."),
    xid: int | None = typer.Option(None, "--xid", help="Inject this XID (79: fallen off the bus)."),
    ecc: int | None = typer.Option(None, "--ecc", help="A burst of this many corrected ECC errors."),
    uncorrected: int = typer.Option(0, "--uncorrected", help="Uncorrected ECC errors in the burst."),
    overheat: float | None = typer.Option(None, "--overheat", help="Set the GPU temperature (C)."),
    nvlink_down: str | None = typer.Option(None, "--nvlink-down", help="Comma-separated NVLink links to take down."),
    gpu_lost: bool = typer.Option(False, "--gpu-lost", help="The GPU falls off the bus."),
    silent: bool = typer.Option(False, "--silent", help="The node stops heartbeating."),
    clear: bool = typer.Option(False, "--clear", help="Undo every fault on the node."),
    cluster: str | None = typer.Option(
        None, "--cluster", help="Its cluster (default: $TRAINYARD_CLUSTER, else local)."
    ),
    nats_url: str | None = typer.Option(None, "--nats-url", envvar="TRAINYARD_NATS_URL"),
    data_dir: str = DataDir,
) -> None:
    """Inject a fault into a running emulated cluster (over NATS request/reply)."""
    import asyncio

    from trainyard.agent.control import ControlRequest, decode_reply, emulator_control_subject, encode

    chosen = {
        "xid": xid is not None,
        "ecc": ecc is not None or uncorrected > 0,
        "overheat": overheat is not None,
        "nvlink_down": nvlink_down is not None,
        "gpu_lost": gpu_lost,
        "silent": silent,
        "clear": clear,
    }
    ops = [op for op, on in chosen.items() if on]
    if len(ops) != 1:
        err_console.print(
            "[red]error:[/red] give exactly one of --xid, --ecc, --overheat, --nvlink-down, "
            "--gpu-lost, --silent, --clear"
        )
        raise typer.Exit(2)
    try:
        links = [int(x) for x in nvlink_down.split(",") if x.strip()] if nvlink_down else None
    except ValueError as err:
        err_console.print(f"[red]error:[/red] --nvlink-down takes link numbers like 0,1: {err}")
        raise typer.Exit(2) from err
    request = ControlRequest(
        op=ops[0],
        node_id=node,
        gpu=gpu,
        xid=xid,
        count=ecc,
        uncorrected=uncorrected,
        temperature_c=overheat,
        links=links,
        by=f"operator:{_operator(None)}",
    )
    cluster = cluster or cli_settings().cluster
    url = nats_url if nats_url is not None else stack_state(data_dir, "TRAINYARD_NATS_URL (or --nats-url)").nats_url

    async def send() -> bytes:
        import nats

        nc = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0)
        try:
            msg = await nc.request(emulator_control_subject(cluster), encode(request), timeout=5)
            return msg.data
        finally:
            await nc.close()

    try:
        reply = decode_reply(asyncio.run(send()))
    except Exception as err:
        from trainyard.redaction import redact

        said = redact(f"no answer from the emulator of cluster {cluster!r} at {url}: {err!r}")
        err_console.print(f"[red]error:[/red] {said}")
        raise typer.Exit(1) from err
    if not reply.ok:
        err_console.print(f"[red]refused:[/red] {reply.message}")
        raise typer.Exit(1)
    console.print(reply.message)
