"""``trainyard submit``: a job from flags or a file, what it runs, and whether
admission accepted it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer
from rich.console import Console

from trainyard.cli.client import ApiError, Client
from trainyard.cli.config import read_file

console = Console()
err_console = Console(stderr=True)

DataDir = typer.Option(".trainyard", "--data-dir", envvar="TRAINYARD_DATA_DIR", help="Where `up` keeps its state.")
ApiUrl = typer.Option(None, "--api-url", help="Gateway URL (default: the stack found from here; see docs/cli.md).")


def _call(fn, *args, **kwargs):  # type: ignore[no-untyped-def]
    try:
        return fn(*args, **kwargs)
    except ApiError as err:
        err_console.print(f"[red]error:[/red] {err}")
        raise typer.Exit(1) from err


def submit(
    tenant: str | None = typer.Option(None, help="Tenant the job belongs to (default: the file's)."),
    queue: str | None = typer.Option(None, help="Queue to submit to (default: the file's, else 'default')."),
    gpus: int = typer.Option(1, help="GPUs per replica."),
    replicas: int = typer.Option(1, help="Replicas of the single role."),
    gpu_type: str = typer.Option("H100", help="GPU type."),
    name: str = typer.Option("job", help="Job name."),
    role: str = typer.Option("trainer", help="Role name."),
    priority_class: str = typer.Option("standard", help="Priority class."),
    duration: float | None = typer.Option(None, help="Simulated run time in seconds (emulated clusters)."),
    image: str | None = typer.Option(None, help="Container image."),
    file: Path | None = typer.Option(
        None, "--file", "-f", help="A full job spec as JSON or YAML (overrides the flags but --tenant and --queue)."
    ),
    job_id: str | None = typer.Option(None, help="Idempotency key / job id."),
    env: list[str] = typer.Option([], "--env", "-e", help="KEY=VALUE for every process (may repeat)."),
    workdir: str | None = typer.Option(
        None, "--workdir", help="Directory the processes start in (default: the directory you submit from)."
    ),
    launch: str = typer.Option("per_gpu", help="per_gpu: a process per GPU; per_replica: one launcher (torchrun)."),
    max_runtime: int | None = typer.Option(None, "--max-runtime", help="Time limit in seconds (default 24 h)."),
    wait: float = typer.Option(
        10.0, help="Seconds to wait for admission to accept or reject the job (0: do not wait)."
    ),
    as_json: bool = typer.Option(False, "--json"),
    nodes: int | None = typer.Option(None, "--nodes", "-N", hidden=True, help="Slurm's; answered with --replicas."),
    api_url: str | None = ApiUrl,
    data_dir: str = DataDir,
    command: list[str] = typer.Argument(None, help="The command every process runs, after `--`."),
) -> None:
    """Submit a job; prints its id, or the reasons it was rejected (and exits 1).

    A command after `--` runs for real on the nodes' agents, one process per GPU
    with the torch.distributed environment (docs/execution.md):
    `trainyard submit --tenant acme --gpus 2 -- python3 train.py`.  Without one,
    `--duration` runs a simulated workload of that many seconds."""
    if nodes is not None:
        err_console.print(
            f"[red]error:[/red] submit has no --nodes: a job is --replicas N of --gpus G GPUs each "
            f"(Slurm's `--nodes {nodes} --gpus-per-node 8` is `--replicas {nodes} --gpus 8`)",
            highlight=False,
        )
        raise typer.Exit(2)
    if file is not None:
        import msgspec

        from trainyard.yaml_input import check_yaml

        text = read_file(file, "the job spec")
        try:
            if file.suffix in (".yaml", ".yml"):
                check_yaml(text, "it")
                body = msgspec.yaml.decode(text)
            else:
                body = json.loads(text)
        except (ValueError, msgspec.DecodeError) as err:
            err_console.print(f"[red]error:[/red] cannot read the job spec {file}: {err}")
            raise typer.Exit(1) from err
        except RecursionError:
            err_console.print(f"[red]error:[/red] the job spec {file} is nested too deeply to be a job spec")
            raise typer.Exit(1) from None
        if not isinstance(body, dict):
            err_console.print(f"[red]error:[/red] {file} must hold one job spec (a mapping)")
            raise typer.Exit(1)
        body.update({k: v for k, v in {"tenant": tenant, "queue": queue}.items() if v is not None})
        _default_workdir(body, workdir)
        if not body.get("tenant"):
            err_console.print(f"[red]error:[/red] {file} names no tenant: add `tenant:` to it or pass --tenant")
            raise typer.Exit(1)
    else:
        if tenant is None:
            err_console.print("[red]error:[/red] say whose job it is: --tenant NAME (or give a job file with -f)")
            raise typer.Exit(2)
        body = {
            "tenant": tenant,
            "queue": queue or "default",
            "name": name,
            "priority_class": priority_class,
            "roles": [{"name": role, "replicas": replicas, "gpus_per_replica": gpus, "gpu_type": gpu_type}],
        }
        role_body = body["roles"][0]
        if command:
            role_body["command"] = list(command)
            role_body["launch"] = launch
        if env:
            role_body["env"] = _env_pairs(env)
        if duration is not None:
            body["simulated_duration_s"] = duration
        if image is not None:
            body["image"] = image
        if duration is None and image is None and not command:
            body["simulated_duration_s"] = 10.0
        if max_runtime is not None:
            body["max_runtime_s"] = max_runtime
        _default_workdir(body, workdir)
    if job_id:
        body["job_id"] = job_id
    client = Client.for_cli(api_url, data_dir)
    result = _call(client.request, "POST", "/v1/jobs", json=body)
    answered = _answered(client, result["job_id"], wait) if wait > 0 else None
    if answered is not None:
        result |= {"status": answered["status"], "errors": answered.get("errors")}
    if as_json:
        console.print_json(data=result)
    else:
        console.print(result["job_id"])
        if answered is None or answered["status"] != "rejected":
            err_console.print(
                f"next: trainyard job {result['job_id']}   trainyard logs {result['job_id']} --follow", highlight=False
            )
    if answered is not None and answered["status"] == "rejected":
        err_console.print(f"[red]rejected:[/red] job {result['job_id']} was not accepted")
        for e in answered.get("errors") or []:
            err_console.print(f"  {e.get('field', '?')}: {e.get('message', '')}")
        raise typer.Exit(1)


def _env_pairs(pairs: list[str]) -> dict[str, str]:
    """``--env KEY=VALUE`` options as a mapping; a pair without ``=`` stops with what to fix."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            err_console.print(f"[red]error:[/red] --env takes KEY=VALUE, got {pair!r}")
            raise typer.Exit(2)
        out[key] = value
    return out


def _default_workdir(body: dict, workdir: str | None) -> None:  # type: ignore[type-arg]
    """Roles with a command start where the job was submitted from (as srun does),
    unless the role or ``--workdir`` names a directory."""
    folder = str(Path(workdir).resolve()) if workdir else str(Path.cwd())
    roles = body.get("roles")
    if not isinstance(roles, list):
        return
    has_job_command = bool(body.get("command"))
    for role_body in roles:
        if not isinstance(role_body, dict) or role_body.get("working_dir"):
            continue
        if role_body.get("command") or has_job_command or workdir:
            role_body["working_dir"] = folder


def _answered(client: Client, job_id: str, wait: float) -> dict | None:
    """The job once admission has accepted or rejected it (a job is readable
    from then on), or None if that takes longer than ``wait`` seconds."""
    deadline = time.monotonic() + wait
    while True:
        try:
            return client.request("GET", f"/v1/jobs/{job_id}")
        except ApiError as err:
            if err.status != 404 or time.monotonic() >= deadline:
                return None
        time.sleep(0.2)
