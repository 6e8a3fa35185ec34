"""``trainyard logs JOB``: one rank's output of one attempt, read through the
gateway from the node that ran it (``GET /v1/jobs/{job_id}/logs``)."""

from __future__ import annotations

import sys
import time

import typer
from rich.console import Console

from trainyard.cli.client import ApiError, Client

err_console = Console(stderr=True)

CHUNK = 64 * 1024
FOLLOW_POLL_S = 1.0

DataDir = typer.Option(".trainyard", "--data-dir", envvar="TRAINYARD_DATA_DIR", help="Where `up` keeps its state.")
ApiUrl = typer.Option(None, "--api-url", help="Gateway URL (default: the stack found from here; see docs/cli.md).")


def logs(
    job_id: str = typer.Argument(..., help="The job."),
    rank: int = typer.Option(0, "--rank", "-r", help="The process rank (RANK) whose output to show."),
    attempt: int = typer.Option(0, "--attempt", "-a", help="The attempt (default: the latest)."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new output until the attempt ends."),
    tail: int = typer.Option(0, "--tail", help="Start this many bytes before the end (0: from the start)."),
    api_url: str | None = ApiUrl,
    data_dir: str = DataDir,
) -> None:
    """Print a job's output: stdout and stderr of one rank (default 0) of its latest attempt.

    Like `kubectl logs` or a Slurm job's output file; `--follow` keeps printing
    until the attempt ends, `--tail N` starts N bytes before the end."""
    client = Client.for_cli(api_url, data_dir)
    offset = -tail if tail > 0 else 0
    params: dict[str, int] = {"rank": rank, "attempt": attempt, "limit": CHUNK}
    while True:
        try:
            chunk = client.request("GET", f"/v1/jobs/{job_id}/logs", params={**params, "offset": offset})
        except ApiError as err:
            if follow and err.status == 503:  # the node's agent is away: wait for it
                err_console.print(f"[yellow]waiting:[/yellow] {err}")
                time.sleep(FOLLOW_POLL_S * 5)
                continue
            err_console.print(f"[red]error:[/red] {err}")
            raise typer.Exit(1) from err
        params["attempt"] = chunk["attempt"]  # a follow stays on the attempt it started with
        sys.stdout.write(chunk["data"])
        sys.stdout.flush()
        offset = chunk["next_offset"]
        more = offset < chunk["size"]
        if more:
            continue
        if not follow or chunk["finished"]:
            return
        time.sleep(FOLLOW_POLL_S)
