"""``trainyard dlq list|show|replay|discard``: the dead letters, through the gateway
(``/v1/deadletters``), as the caller's token (operator or admin)."""

from __future__ import annotations

import time
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from trainyard.cli.client import ApiError, Client
from trainyard.cli.output import AsJson, Column, NoHeaders, Output, OutputOpt, chosen, print_items, print_shown

dlq_app = typer.Typer(
    help="Dead letters: messages a service could never handle, with the reason.", no_args_is_help=True
)

console = Console()
err_console = Console(stderr=True)

DataDir = typer.Option(".trainyard", "--data-dir", envvar="TRAINYARD_DATA_DIR", help="Where `up` keeps its state.")
ApiUrl = typer.Option(None, "--api-url", help="Gateway URL (default: the stack found from here; see docs/cli.md).")


def _request(api_url: str | None, data_dir: str, method: str, path: str, **kwargs: Any) -> Any:
    try:
        return Client.for_cli(api_url, data_dir).request(method, path, **kwargs)
    except ApiError as err:
        err_console.print(f"[red]error:[/red] {escape(str(err))}")
        raise typer.Exit(1) from err


def _ts(value: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(value)) if value else "-"


def _size(letter: dict[str, Any]) -> str:
    return f"{letter['size']} B" + (f" (kept {letter['kept']})" if letter["truncated"] else "")


LETTER_COLUMNS = [
    Column("seq", lambda d: str(d["seq"])),
    Column("at", lambda d: _ts(d["at"])),
    Column("stream", lambda d: d["stream"]),
    Column("subject", lambda d: d["subject"]),
    Column("stream seq", lambda d: str(d["stream_seq"] or "-")),
    Column("size", _size),
    Column("replay", lambda d: "yes" if d["replayable"] else "no"),
    Column("reason", lambda d: d["reason"]),
]


@dlq_app.command("list")
def list_command(
    stream: str | None = typer.Option(None, "--stream", help="Only those from INTAKE, JOBS, NODES or TELEMETRY."),
    limit: int = typer.Option(50, "--limit", help="At most this many (1-1000)."),
    before: int | None = typer.Option(None, "--before", help="Only those below this sequence (the next page)."),
    output: Output = OutputOpt,
    as_json: bool = AsJson,
    no_headers: bool = NoHeaders,
    api_url: str | None = ApiUrl,
    data_dir: str = DataDir,
) -> None:
    """Dead letters, newest first: reason, original stream, subject and sequence, time and size."""
    params: dict[str, Any] = {"limit": limit}
    if stream:
        params["stream"] = stream
    if before:
        params["before"] = before
    letters = _request(api_url, data_dir, "GET", "/v1/deadletters", params=params)["deadletters"]
    output = chosen(output, as_json)
    if not letters and output in (Output.table, Output.wide):
        err_console.print("no dead letters")
        return
    print_items(letters, LETTER_COLUMNS, output, no_headers, name=lambda d: str(d["seq"]))
    if len(letters) == limit and output in (Output.table, Output.wide):
        err_console.print(f"more may follow: trainyard dlq list --before {letters[-1]['seq']}")


@dlq_app.command("show")
def show_command(
    seq: int, output: Output = OutputOpt, as_json: bool = AsJson, api_url: str | None = ApiUrl, data_dir: str = DataDir
) -> None:
    """One dead letter in full, with the data it kept (-o json|yaml for the API's object)."""
    d = _request(api_url, data_dir, "GET", f"/v1/deadletters/{seq}")
    if print_shown(d, chosen(output, as_json), str(d["seq"])):
        return
    rows = [
        ("seq", d["seq"]),
        ("at", _ts(d["at"])),
        ("stream", d["stream"]),
        ("subject", d["subject"]),
        ("stream seq", d["stream_seq"] if d["stream_seq"] is not None else "-"),
        ("reason", d["reason"]),
        ("size", _size(d)),
        ("truncated", "yes" if d["truncated"] else "no"),
        ("replayable", "yes" if d["replayable"] else "no"),
    ]
    for name, value in rows:
        console.print(f"[bold]{name:>11}[/bold]  {escape(str(value))}")
    console.print("[bold]       data[/bold]")
    console.out(d["data"], highlight=False)


@dlq_app.command("replay")
def replay_command(
    seq: int,
    reason: str = typer.Option("", "--reason", help="Why (recorded in the audit stream)."),
    api_url: str | None = ApiUrl,
    data_dir: str = DataDir,
) -> None:
    """Publish a dead letter's message again on its original subject (with a new message id)."""
    r = _request(api_url, data_dir, "POST", f"/v1/deadletters/{seq}/replay", json={"reason": reason})
    console.print(f"replayed dead letter {r['seq']} on {escape(r['subject'])} as {r['stream']} seq {r['replayed_seq']}")


@dlq_app.command("discard")
def discard_command(
    seq: int,
    reason: str = typer.Option("", "--reason", help="Why (recorded in the audit stream)."),
    api_url: str | None = ApiUrl,
    data_dir: str = DataDir,
) -> None:
    """Remove a dead letter once it has been dealt with (nothing is published)."""
    r = _request(api_url, data_dir, "DELETE", f"/v1/deadletters/{seq}", json={"reason": reason})
    console.print(f"discarded dead letter {r['seq']} ({r['stream']}, {escape(r['subject'])})")
