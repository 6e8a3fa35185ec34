"""``trainyard export ...`` and ``trainyard report ...``: chargeback and capacity planning.

Both read the ledger directly when they can find it (``--ledger-url``,
``TRAINYARD_LEDGER_URL``, or the running ``trainyard up`` stack's
state.json); ``export chargeback --via-api`` (or ``--api-url``) asks the
gateway instead, with the caller's token (finance or admin).
"""

from __future__ import annotations

import calendar
import csv
import datetime as dt
import io
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from trainyard.cli.discovery import find_data_dir
from trainyard.cli.settings import cli_settings

if TYPE_CHECKING:
    import httpx

export_app = typer.Typer(help="Chargeback exports for finance.", no_args_is_help=True)
report_app = typer.Typer(help="Capacity-planning and usage reports.", no_args_is_help=True)

err_console = Console(stderr=True)
console = Console()

DataDir = typer.Option(".trainyard", "--data-dir", envvar="TRAINYARD_DATA_DIR", help="Where `up` keeps its state.")
LedgerUrl = typer.Option(
    None, "--ledger-url", help="Ledger database URL (default: $TRAINYARD_LEDGER_URL, else the running stack's)."
)
ApiUrl = typer.Option(None, "--api-url", help="Gateway URL (default: $TRAINYARD_API_URL, the running stack, :8080).")


def _fail(message: str) -> typer.Exit:
    """Print ``message`` as the error (any credential in a URL replaced) and exit 1."""
    from trainyard.redaction import redact

    err_console.print(f"[red]error:[/red] {redact(message)}")
    return typer.Exit(1)


def _unreachable(url: str, err: Exception) -> typer.Exit:
    """The error for a ledger that cannot be read (``_fail`` hides the URL's password)."""
    reason = (str(getattr(err, "orig", None) or err).strip().splitlines() or ["no reason given"])[0]
    return _fail(
        f"cannot read the ledger at {url}: {reason}; check --ledger-url (or TRAINYARD_LEDGER_URL) "
        "and that its database is running"
    )


def _ledger_url(ledger_url: str | None, data_dir: str) -> str:
    from trainyard.local.state import read_state

    if ledger_url:
        return ledger_url
    given = cli_settings().given("ledger_url")
    if given:
        return given
    state = read_state(find_data_dir(data_dir))
    if state is not None:
        return state.ledger_url
    raise _fail(f"no ledger: pass --ledger-url, set TRAINYARD_LEDGER_URL, or run `trainyard up` (data dir {data_dir})")


#: Periods named relative to today (UTC), accepted wherever a month is.
RELATIVE_PERIODS = ("this-month", "last-month")


def resolve_period(period: str, now: float | None = None) -> str:
    """``this-month`` / ``last-month`` -> ``YYYY-MM`` of the current or the
    previous UTC month at ``now``; any other text is returned as given."""
    if period not in RELATIVE_PERIODS:
        return period
    today = dt.datetime.fromtimestamp(time.time() if now is None else now, dt.UTC).date()
    first = today.replace(day=1)
    if period == "last-month":
        first = (first - dt.timedelta(days=1)).replace(day=1)
    return f"{first.year:04d}-{first.month:02d}"


def period_days(period: str) -> tuple[str, str]:
    """First and last day (``YYYY-MM-DD``) of a month ``YYYY-MM``."""
    first = dt.date.fromisoformat(f"{period}-01")
    last = first.replace(day=calendar.monthrange(first.year, first.month)[1])  # December 9999 included
    return first.isoformat(), last.isoformat()


def _get(
    api_url: str | None, data_dir: str, path: str, params: Mapping[str, str | int | float | None]
) -> httpx.Response:
    """GET from the gateway with the caller's token (``--token``, ``$TRAINYARD_TOKEN``, the stack's admin token)."""
    import httpx

    from trainyard.cli.client import auth_headers, describe_error, resolve_api_url, resolve_token

    url, token = resolve_api_url(api_url, data_dir), resolve_token(None, data_dir)
    try:
        response = httpx.get(url.rstrip("/") + path, params=params, headers=auth_headers(token), timeout=120)
    except httpx.HTTPError as err:
        raise _fail(f"cannot reach the Trainyard API at {url} ({err}); is `trainyard up` running?") from err
    if response.status_code >= 400:
        raise _fail(describe_error(response, token is not None))
    return response


# --- export chargeback ---------------------------------------------------------------------------------


@export_app.command("chargeback")
def export_chargeback(
    period: str = typer.Option(..., help="Billing month: YYYY-MM, this-month or last-month (UTC)."),
    fmt: str = typer.Option("csv", "--format", help="csv or parquet."),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="Directory for chargeback-PERIOD.FORMAT (default: $TRAINYARD_EXPORT_DIR, else the stack's data dir's "
        "exports/, else ~/.local/share/trainyard/exports).",
    ),
    output: Path | None = typer.Option(None, "--output", "-o", help="Exact file to write instead ('-' for stdout)."),
    ledger_url: str | None = LedgerUrl,
    rate_card: Path | None = typer.Option(None, help="Rate card file (default: $TRAINYARD_RATE_CARD, else examples/)."),
    cost_centres: Path | None = typer.Option(
        None, help="Cost-centre map (default: $TRAINYARD_COST_CENTRES, else examples/)."
    ),
    as_of: float | None = typer.Option(None, help="Charge open runs up to this Unix time (default: now)."),
    via_api: bool = typer.Option(
        False, "--via-api", help="Ask the gateway (with a finance or admin token) instead of reading the ledger."
    ),
    api_url: str | None = ApiUrl,
    data_dir: str = DataDir,
) -> None:
    """Export one month's chargeback (FOCUS-style columns) as CSV or Parquet."""
    from trainyard.ledger import Ledger, RateCardError, chargeback_rows, chargeback_summary, encode_rows, period_bounds
    from trainyard.ledger.finance_config import read_cost_centres, read_rate_card

    if fmt not in ("csv", "parquet"):
        raise _fail(f"--format {fmt!r} is not supported; use csv or parquet")
    if out is not None and output is not None:
        raise _fail("give --out DIR (a directory) or --output FILE, not both")
    period = resolve_period(period, as_of)
    try:
        period_bounds(period)
    except ValueError as err:
        raise _fail(str(err)) from err
    if via_api or api_url:
        params = {"period": period, "format": fmt} | ({"as_of": as_of} if as_of is not None else {})
        response = _get(api_url, data_dir, "/v1/exports/chargeback", params)
        body, rows, total = response.content, response.headers.get("X-Trainyard-Rows", "?"), _api_total(response)
    else:
        import sqlalchemy.exc

        url = _ledger_url(ledger_url, data_dir)
        ledger = Ledger(url)
        try:
            card = read_rate_card(rate_card)
            result = chargeback_rows(ledger, period, card, cost_centres=read_cost_centres(cost_centres), now=as_of)
        except RateCardError as err:
            raise _fail(str(err)) from err
        except sqlalchemy.exc.OperationalError as err:
            raise _unreachable(url, err) from err
        finally:
            ledger.close()
        body, rows = encode_rows(result, fmt), str(len(result))  # type: ignore[arg-type]
        total = chargeback_summary(result).describe(card.currency)
    if output is not None and str(output) == "-":
        sys.stdout.buffer.write(body)
        sys.stdout.flush()
        return
    path = output or _export_dir(out, data_dir) / f"chargeback-{period}.{fmt}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
    except OSError as err:
        raise _fail(f"cannot write {path}: {err.strerror}; pass --out DIR (or set TRAINYARD_EXPORT_DIR)") from err
    err_console.print(f"wrote {path.resolve()}: {rows} rows, {total}", highlight=False, soft_wrap=True)


def _export_dir(out: Path | None, data_dir: str) -> Path:
    """``--out``, else ``TRAINYARD_EXPORT_DIR``, else the default (:func:`default_export_dir`)."""
    from trainyard.cli.discovery import default_export_dir

    if out is not None:
        return out
    given = cli_settings().export_dir
    return Path(given) if given else default_export_dir(data_dir)


def _api_total(response: httpx.Response) -> str:
    """The gateway's totals of an export, as the command prints its own."""
    total = response.headers.get("X-Trainyard-Billed-Total", "?")
    credit = response.headers.get("X-Trainyard-Credit-Total")
    if credit and not credit.startswith("0.00 "):
        gross = response.headers.get("X-Trainyard-Gross-Total", "?").split(" ")[0]
        return f"billed total {total} (gross {gross}, hardware-failure credit {credit.split(' ')[0]})"
    return f"billed total {total}"


# --- report capacity -----------------------------------------------------------------------------------


async def _stack_capacity(redis_url: str, prefix: str) -> dict[str, int]:
    from trainyard.reports import capacity_from_nodes
    from trainyard.store import Store, views

    store = Store.from_url(redis_url, prefix)
    try:
        nodes = await views.node_views(store)
    finally:
        await store.close()
    return capacity_from_nodes((info.gpu_type, info.gpus) for info, _, _ in nodes)


def _capacity(capacity: str | None, data_dir: str) -> tuple[dict[str, int], str]:
    """GPUs per type and where they were read (for the report: no credential in it)."""
    from trainyard.local.state import read_state
    from trainyard.redaction import redact
    from trainyard.reports import parse_capacity

    if capacity:
        try:
            return parse_capacity(capacity), "--capacity"
        except ValueError as err:
            raise _fail(str(err)) from err
    state = read_state(find_data_dir(data_dir))
    if state is None:
        raise _fail("no capacity: pass --capacity H100=128 (GPUs) or H100=16x8 (nodes x GPUs), or run `trainyard up`")
    prefix = cli_settings().redis_prefix
    import asyncio

    import redis.exceptions

    try:
        found = asyncio.run(_stack_capacity(state.redis_url, prefix))
    except (OSError, redis.exceptions.RedisError) as err:
        raise _fail(f"cannot read the NODES projection at {redact(state.redis_url)} ({err}); pass --capacity") from err
    if not found:
        raise _fail("the running stack has no registered nodes yet; pass --capacity H100=128")
    return found, f"the NODES projection at {redact(state.redis_url)}"


@report_app.command("capacity")
def report_capacity(
    start: str | None = typer.Option(None, "--from", help="First day, YYYY-MM-DD (UTC)."),
    end: str | None = typer.Option(None, "--to", help="Last day, YYYY-MM-DD (UTC), included."),
    period: str | None = typer.Option(
        None, help="A whole month instead of --from/--to: YYYY-MM, this-month or last-month."
    ),
    out: Path = typer.Option(Path("capacity-report"), "--out", help="Directory for capacity.html and the CSV files."),
    capacity: str | None = typer.Option(
        None, help="GPUs per type, e.g. 'H100=128,A100=16x8' (default: the running stack's nodes)."
    ),
    bucket: str = typer.Option("day", help="Time bucket of the allocation table and charts: day or hour."),
    horizon: int = typer.Option(14, help="Days of demand forecast past the last complete day."),
    as_of: float | None = typer.Option(None, help="Report as of this Unix time (default: now)."),
    ledger_url: str | None = LedgerUrl,
    data_dir: str = DataDir,
) -> None:
    """Allocation vs capacity per GPU type, pending demand, queue waits, lost work and a demand forecast."""
    import sqlalchemy.exc

    from trainyard.ledger import Ledger
    from trainyard.reports import capacity_report, parse_instant, report_files, window_problem

    if period is not None:
        if start or end:
            raise _fail("give either --period or --from/--to, not both")
        try:
            start, end = period_days(resolve_period(period, as_of))
        except ValueError as err:
            raise _fail(f"--period {period!r} is not a month (YYYY-MM, this-month or last-month)") from err
    if not start or not end:
        raise _fail("say which days: --from YYYY-MM-DD --to YYYY-MM-DD, or --period this-month")
    try:
        lo = parse_instant(start)
    except ValueError as err:
        raise _fail(f"--from: {err}") from err
    try:
        hi = parse_instant(end, end_of_day=True)
    except ValueError as err:
        raise _fail(f"--to: {err}") from err
    if lo is None or hi is None or hi <= lo or lo % 86_400 or hi % 86_400:
        raise _fail("--from and --to must be dates (YYYY-MM-DD), --to on or after --from")
    if bucket not in ("day", "hour"):
        raise _fail("--bucket must be day or hour")
    if problem := window_problem(lo, hi, 86_400.0 if bucket == "day" else 3_600.0, horizon):
        raise _fail(f"--from/--to/--horizon: {problem}")
    gpus, source = _capacity(capacity, data_dir)
    url = _ledger_url(ledger_url, data_dir)
    ledger = Ledger(url)
    try:
        jobs = ledger.jobs(end=hi)
        runs = [r for r in ledger.runs() if (r.placed_at if r.placed_at is not None else r.started_at or hi) < hi]
    except sqlalchemy.exc.OperationalError as err:
        raise _unreachable(url, err) from err
    finally:
        ledger.close()
    now = time.time() if as_of is None else as_of
    report = capacity_report(
        runs, jobs, gpus, lo, hi, now, bucket_s=86_400.0 if bucket == "day" else 3_600.0, horizon_days=horizon
    )
    out.mkdir(parents=True, exist_ok=True)
    for name, text in report_files(report, source).items():
        (out / name).write_text(text)
    err_console.print(f"wrote {out / 'capacity.html'} and {len(report_files(report)) - 1} CSV files to {out}")


# --- report usage -------------------------------------------------------------------------------------


@report_app.command("usage")
def report_usage(
    start: str | None = typer.Option(None, "--from", help="Start: YYYY-MM-DD, ISO time or Unix seconds."),
    end: str | None = typer.Option(None, "--to", help="End: a date includes that day."),
    group_by: str = typer.Option("tenant,gpu_type", help="Comma-separated: tenant, queue, gpu_type, job."),
    tenant: str | None = typer.Option(None, help="Only this tenant."),
    as_csv: bool = typer.Option(False, "--csv", help="Print CSV instead of a table."),
    api_url: str | None = ApiUrl,
    data_dir: str = DataDir,
) -> None:
    """GPU usage through GET /v1/usage, over a window and grouped (every tenant's for a finance
    or admin token, the token's own tenant's for a researcher or tenant-admin)."""
    from trainyard.cli.output import print_table

    params = {k: v for k, v in {"from": start, "to": end, "group_by": group_by, "tenant": tenant}.items() if v}
    rows = _get(api_url, data_dir, "/v1/usage", params).json()
    columns = list(rows[0].keys()) if rows else [*group_by.split(","), "gpu_seconds", "gpu_hours"]
    if as_csv:
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        sys.stdout.write(buffer.getvalue())
        return
    cells = [[f"{row[c]:,.3f}" if isinstance(row[c], float) else str(row[c]) for c in columns] for row in rows]
    print_table(columns, cells)  # piped, printed whole
