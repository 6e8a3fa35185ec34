"""``trainyard jobs``, ``job``, ``why`` and ``cancel``: jobs as a person or a
script reads them (formats: :mod:`trainyard.cli.output`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from trainyard.cli.client import ApiError, Client
from trainyard.cli.output import AsJson, Column, Item, NoHeaders, Output, OutputOpt, chosen, print_items, print_shown

T = TypeVar("T")
console = Console(soft_wrap=True)  # a long line is not broken at 80 columns when piped
err_console = Console(stderr=True)

DataDir = typer.Option(".trainyard", "--data-dir", envvar="TRAINYARD_DATA_DIR", help="Where `up` keeps its state.")
ApiUrl = typer.Option(None, "--api-url", help="Gateway URL (default: the stack found from here; see docs/cli.md).")

FIRST_PAGE = 50  # jobs `trainyard jobs` lists without --limit or --all
NODES_SHOWN = 3  # nodes a table names before "+N" (-o wide names every one)
#: What users of Ray's `ray job ...` type after `trainyard job`, and the Trainyard command for it.
_RAY_JOB_VERBS = {
    "list": "trainyard jobs",
    "submit": "trainyard submit --tenant TENANT --gpus N -- COMMAND",
    "status": "trainyard job JOB",
    "logs": "trainyard logs JOB",
    "stop": "trainyard cancel JOB",
}


def request(api_url: str | None, data_dir: str, method: str, path: str, **kwargs: Any) -> Any:
    """One call to the gateway; an error ends the command with exit 1, saying what went wrong."""
    return calling(api_url, data_dir, lambda client: client.request(method, path, **kwargs))


def calling(api_url: str | None, data_dir: str, call: Callable[[Client], T]) -> T:
    """``call`` on the gateway's client; an error ends the command with exit 1, saying what went wrong."""
    try:
        return call(Client.for_cli(api_url, data_dir))
    except ApiError as err:
        err_console.print(f"[red]error:[/red] {escape(str(err))}", highlight=False)
        raise typer.Exit(1) from err


def clock(seconds: float) -> str:
    """A duration as squeue prints it: M:SS, H:MM:SS, or D-HH:MM:SS."""
    whole = max(int(seconds), 0)
    days, rest = divmod(whole, 86_400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def elapsed(job: Item, now: float) -> str:
    """How long the job has run (its current or last run): from its start to its end, or to now."""
    started = job.get("started_at")
    if not started:
        return ""
    return clock((job.get("finished_at") or now) - started)


def node_ids(job: Item) -> list[str]:
    return sorted({r["node_id"] for r in job.get("placement") or []})


def nodes_cell(job: Item, every: bool = False) -> str:
    ids = node_ids(job)
    if every or len(ids) <= NODES_SHOWN:
        return ",".join(ids)
    return ",".join(ids[:NODES_SHOWN]) + f",+{len(ids) - NODES_SHOWN}"


def reason(job: Item) -> str:
    """Why it waits, why it was rejected, or why its last run failed or it was cancelled."""
    if job.get("status") == "rejected" and job.get("errors"):
        return "; ".join(f"{e.get('field', '?')}: {e.get('message', '')}" for e in job["errors"])
    return job.get("reason") or ""


def when(at: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(at)) if at else "-"


def _age(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m"
    if seconds < 172_800:
        return f"{seconds / 3600:.0f}h"
    return f"{seconds / 86400:.0f}d"


def job_columns(now: float, every_node: bool = False) -> list[Column]:
    return [
        Column("job", lambda j: j["job_id"]),
        Column("name", lambda j: j.get("name") or ""),
        Column("tenant", lambda j: j["tenant"]),
        Column("queue", lambda j: j.get("queue") or ""),
        Column("GPUs", lambda j: str(j.get("gpus", 0))),
        Column("status", lambda j: j["status"]),
        Column("elapsed", lambda j: elapsed(j, now)),
        Column("nodes", lambda j: nodes_cell(j, every_node)),
        Column("priority", lambda j: j.get("priority_class") or "", wide=True),
        Column("run", lambda j: str(j.get("attempt", 0)), wide=True),
        Column("age", lambda j: _age(now - j["submitted_at"]) if j.get("submitted_at") else ""),
        Column("reason", reason),
    ]


def jobs(
    tenant: str | None = typer.Option(None, help="Only this tenant's jobs."),
    status: str | None = typer.Option(None, help="Only jobs in this status."),
    submitted_after: str | None = typer.Option(
        None, help="Only jobs submitted at or after this time (a date, an ISO 8601 time or Unix seconds)."
    ),
    submitted_before: str | None = typer.Option(None, help="Only jobs submitted before this time."),
    limit: int | None = typer.Option(
        None, help=f"List this many (newest first), reading as many pages as that takes [default: {FIRST_PAGE}]."
    ),
    every: bool = typer.Option(
        False,
        "--all",
        help="List every job, reading every page, the archived ones too (finished past their retention).",
    ),
    cursor: str | None = typer.Option(None, help="Start after the jobs already listed (the cursor a list printed)."),
    output: Output = OutputOpt,
    as_json: bool = AsJson,
    no_headers: bool = NoHeaders,
    api_url: str | None = ApiUrl,
    data_dir: str = DataDir,
) -> None:
    """List jobs, newest first: status, elapsed time, nodes and why each waits.

    Shows the newest 50 and says how to see more: `--limit N` or `--all` read
    page after page (`-o json` then prints every job as one list; `--all` also
    lists jobs that finished longer ago than their retention, from the job
    archive), `--cursor`
    goes on from where a list stopped.  `-o wide` adds columns, `-o json|yaml`
    prints everything, `-o name` only ids; piped (`trainyard jobs | grep
    running`) the table is printed whole."""
    params = {
        "tenant": tenant,
        "status": status,
        "submitted_after": submitted_after,
        "submitted_before": submitted_before,
        "cursor": cursor,
        "archived": "true" if every else None,
    }
    if limit is not None and limit < 1:
        raise typer.BadParameter(f"{limit} jobs: give 1 or more (or --all)", param_hint="--limit")
    most = None if every else limit or FIRST_PAGE
    items, following = calling(api_url, data_dir, lambda client: client.walk("/v1/jobs", "jobs", params, most))
    output = chosen(output, as_json)
    columns = job_columns(time.time(), every_node=output is Output.wide)
    print_items(items, columns, output, no_headers, name=lambda j: j["job_id"])
    if following is not None:
        err_console.print(
            f"{len(items)} shown; more: `trainyard jobs --limit N` or `--all` (same filters), "
            f"or the next ones with `--cursor {following}`",
            highlight=False,
            soft_wrap=True,
        )


def job(
    job_id: str,
    output: Output = OutputOpt,
    as_json: bool = AsJson,
    api_url: str | None = ApiUrl,
    data_dir: str = DataDir,
) -> None:
    """Show one job: its name, status, times, why it waits and where it runs (`-o json|yaml` for everything)."""
    if job_id in _RAY_JOB_VERBS:
        err_console.print(f"hint: `trainyard job` shows one job; for `job {job_id}` use: {_RAY_JOB_VERBS[job_id]}")
    j = request(api_url, data_dir, "GET", f"/v1/jobs/{job_id}")
    if print_shown(j, chosen(output, as_json), str(j["job_id"])):
        return
    show_job(j, time.time())


def show_job(j: Item, now: float) -> None:
    spec = j.get("spec") or {}
    queue = j.get("queue") or spec.get("queue") or "-"
    status = "[red]rejected[/red]" if j.get("status") == "rejected" else escape(j["status"])
    console.print(f"[bold]{escape(j['job_id'])}[/bold]  {status}", highlight=False)
    lines = [
        ("name", j.get("name") or spec.get("name") or "-"),
        ("tenant", j["tenant"]),
        ("queue", queue),
        ("GPUs", str(j.get("gpus", 0))),
        ("attempt", f"{j.get('attempt', 0)}  run {j.get('run_id') or '-'}"),
        ("submitted", when(j.get("submitted_at"))),
        ("started", when(j.get("started_at"))),
        ("ended", when(j.get("finished_at"))),
        ("elapsed", elapsed(j, now) or "-"),
        ("nodes", nodes_cell(j, every=True) or "-"),
    ]
    if j.get("reason") and j.get("status") != "pending":
        lines.append(("reason", j["reason"] + (f": {j['message']}" if j.get("message") else "")))
    for label, value in lines:
        console.print(f"  {label:<10} {escape(value)}", highlight=False)
    if j.get("status") == "pending" and j.get("reason"):
        console.print(f"  waiting: {escape(j['reason'])} (position {j.get('position') or '?'})", highlight=False)
    for e in j.get("errors") or []:
        console.print(f"  [red]{escape(e['field'])}[/red]: {escape(e['message'])}", highlight=False)
    for r in j.get("placement") or []:
        console.print(f"  rank {r['rank']:>4}  {r['role']}[{r['replica']}]  {r['node_id']}  GPUs {r['gpus']}")


def cancel(job_id: str, api_url: str | None = ApiUrl, data_dir: str = DataDir) -> None:
    """Cancel a job that has not finished."""
    request(api_url, data_dir, "DELETE", f"/v1/jobs/{job_id}")
    console.print(f"cancel requested for {job_id}")


def why(job_id: str, api_url: str | None = ApiUrl, data_dir: str = DataDir) -> None:
    """Why is this job pending, and where is it in line?"""
    from trainyard.core.reasons import REASON_TEXT, PendingReason

    j = request(api_url, data_dir, "GET", f"/v1/jobs/{job_id}")
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
    code = j.get("reason")
    try:
        text = REASON_TEXT[PendingReason(code)]
    except ValueError:
        text = code or "not yet considered by admission"
    position = f", position {j['position']} in line" if j.get("position") else ""
    console.print(f"{job_id} is pending: {text} ({code or 'new'}{position}).")
    if j.get("expected_start"):
        console.print(f"  expected to start around {time.strftime('%H:%M:%S', time.localtime(j['expected_start']))}")
