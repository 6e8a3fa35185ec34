"""``trainyard traces``: the public traces the simulator reads (docs/traces.md).

``fetch`` downloads the files that are not in the traces folder, each pinned to a
commit of its upstream repository and checked against its SHA-256
(:mod:`trainyard.sim.sources`)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

traces_app = typer.Typer(help="The public traces the simulator reads (docs/traces.md).", no_args_is_help=True)


@traces_app.command("fetch")
def fetch_command(
    dest: str = typer.Option(
        None, "--dest", help="folder to fetch into (default: $TRAINYARD_TRACES, else the repository's traces/)"
    ),
    only: list[str] = typer.Option([], "--only", help="a trace folder: philly, helios or alibaba_pai_2023 (repeat)"),
    mirror: str = typer.Option(
        None, "--mirror", help="base URL with the same paths as https://raw.githubusercontent.com (an offline mirror)"
    ),
) -> None:
    """Fetch the trace files missing from the traces folder, each checked against its pinned SHA-256."""
    from trainyard.sim.sources import UPSTREAM, FetchError, fetch, selected
    from trainyard.sim.workloads import traces_dir

    console = Console(width=200)
    folder = traces_dir(dest)
    try:
        sources = selected(only)
        outcome = fetch(
            Path(folder), sources, base=mirror or UPSTREAM, progress=lambda line: console.print(escape(line))
        )
    except FetchError as e:
        console.print(f"[red]error:[/red] {escape(str(e))}")
        raise typer.Exit(2) from None
    except OSError as e:
        console.print(f"[red]error:[/red] {escape(str(folder))}: cannot write there ({e.strerror or e})")
        raise typer.Exit(2) from None
    fetched = sum(1 for v in outcome.values() if v == "fetched")
    console.print(f"{escape(str(folder))}: {fetched} fetched, {len(outcome) - fetched} already there and intact")
    for source in sources:
        if not source.committed:
            console.print(f"  {source.path}: {source.licence}")
