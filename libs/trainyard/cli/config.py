"""``trainyard config validate|diff|apply|show``: the tenancy configuration."""

from __future__ import annotations

import getpass
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from trainyard.cli.discovery import find_data_dir

if TYPE_CHECKING:  # imported where used: `trainyard --help` does not load the configuration code
    from trainyard.config.store import ConfigStore

config_app = typer.Typer(help="Tenancy configuration: organisations, teams, queues, quotas.", no_args_is_help=True)
console = Console()
err_console = Console(stderr=True)

FileArg = typer.Argument(..., exists=True, dir_okay=False, readable=True, help="A tenancy YAML file.")
DataDir = typer.Option(".trainyard", "--data-dir", envvar="TRAINYARD_DATA_DIR")
ApiUrl = typer.Option(None, "--api-url", help="Gateway whose fleet the quotas are checked against (default: found).")


def nats_url(data_dir: str) -> str:
    """TRAINYARD_NATS_URL, else the running `trainyard up` of ``data_dir``; with neither, exit 1 saying so."""
    from trainyard.cli.settings import cli_settings

    settings = cli_settings()
    if settings.given("nats_url"):
        return settings.nats_url
    return stack_state(data_dir, "TRAINYARD_NATS_URL").nats_url


def stack_state(data_dir: str, variables: str):  # type: ignore[no-untyped-def]
    """The running `trainyard up` of ``data_dir``; with none, exit 1 naming ``variables`` to set instead.
    A command never falls back to the standard ports: on a machine that runs some other NATS or Redis
    there, it would write Trainyard's streams and keys into that server."""
    from trainyard.local.state import read_state

    data_dir = find_data_dir(data_dir)
    state = read_state(data_dir)
    if state is None:
        err_console.print(
            f"[red]error:[/red] no Trainyard here: no `trainyard up` is running with data dir {data_dir} "
            f"and {variables} {'are' if ' and ' in variables else 'is'} not set; start `trainyard up`, pass "
            f"--data-dir, or set {variables} to your installation's"
        )
        raise typer.Exit(1)
    return state


def read_file(path: Path, what: str) -> str:
    """A text file given on the command line; one that cannot be read, or is not UTF-8, exits 1 saying so."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        err_console.print(
            f"[red]error:[/red] {what} {path} is not UTF-8 text (byte 0x{err.object[err.start]:02x} at offset "
            f"{err.start}); save it as UTF-8"
        )
        raise typer.Exit(1) from None
    except OSError as err:
        err_console.print(f"[red]error:[/red] cannot read {what} {path}: {err.strerror or err}")
        raise typer.Exit(1) from None


def _validated(path: Path):  # type: ignore[no-untyped-def]
    from trainyard.config.store import parse_and_validate
    from trainyard.config.tenancy import TenancyConfigError

    try:
        return parse_and_validate(read_file(path, "the tenancy file"))
    except TenancyConfigError as err:
        err_console.print(f"[red]{path}: {len(err.errors)} problem(s)[/red]")
        for e in err.errors:
            err_console.print(f"  {e.path}: {e.message}", soft_wrap=True, highlight=False, markup=False)
        raise typer.Exit(1) from err


def check_fleet(cfg, api_url: str | None, data_dir: str) -> None:  # type: ignore[no-untyped-def]
    """Warn (never fail) naming the GPU types ``cfg`` gives quota that no node of the running fleet has;
    without a reachable stack, say that the fleet could not be checked."""
    from trainyard.cli.client import ApiError, Client

    quota_types = {
        flavor
        for org in cfg.organisations
        for node in [org, *org.teams, *(q for t in org.teams for q in t.queues)]
        for flavor, limits in node.quota.items()
        if limits.nominal > 0
    }
    try:
        nodes, _ = Client.for_cli(api_url, data_dir, timeout=5.0).walk("/v1/nodes", "nodes", {}, None)
    except ApiError as err:
        err_console.print(f"note: the fleet was not checked: {err}", soft_wrap=True, highlight=False, markup=False)
        return
    have: dict[str, int] = {}
    for node in nodes:
        gpu_type = (node.get("info") or {}).get("gpu_type")
        if gpu_type:
            have[gpu_type] = have.get(gpu_type, 0) + 1
    missing = sorted(quota_types - set(have))
    if missing:
        fleet = ", ".join(f"{t} on {n} node(s)" for t, n in sorted(have.items())) or "no nodes yet"
        err_console.print(
            f"[yellow]warning:[/yellow] the running fleet has no {', '.join(missing)} GPUs (it has {fleet}); "
            f"jobs of {'that type' if len(missing) == 1 else 'those types'} are admitted against these quotas "
            "and wait until such nodes join",
            soft_wrap=True,
            highlight=False,
        )


def _run(work):  # type: ignore[no-untyped-def]
    import asyncio  # here, not at the top: `trainyard --help` never loads the event loop

    return asyncio.run(work)


async def _with_store(url: str, fn):  # type: ignore[no-untyped-def]
    from trainyard.bus import Bus

    try:
        bus = await Bus.connect(url, "trainyard-cli")
    except Exception as err:
        from trainyard.redaction import redact

        said = redact(f"cannot reach NATS at {url} ({err}); is `trainyard up` running?")
        err_console.print(f"[red]error:[/red] {said}")
        raise typer.Exit(1) from err
    from trainyard.config.store import ConfigStore

    try:
        return await fn(await ConfigStore.open(bus))
    finally:
        await bus.close()


@config_app.command()
def validate(file: Path = FileArg, api_url: str | None = ApiUrl, data_dir: str = DataDir) -> None:
    """Check a tenancy file; every problem is listed with the path to fix (a misspelt key with the nearest
    known one), and GPU types given quota that the running fleet lacks are warned about."""
    cfg = _validated(file)
    queues = sum(len(t.queues) for o in cfg.organisations for t in o.teams)
    console.print(f"{file}: valid ({len(cfg.organisations)} organisations, {queues} queues)")
    check_fleet(cfg, api_url, data_dir)


@config_app.command()
def diff(file: Path = FileArg, data_dir: str = DataDir) -> None:
    """Show what applying FILE would change."""
    from trainyard.config.diff import diff_tenancy

    new = _validated(file)

    async def run(store: ConfigStore) -> None:
        current = await store.current()
        if current is None:
            console.print("no tenancy configuration is in force; applying would install this one")
            return
        changes = diff_tenancy(current.config, new)
        console.print(f"against revision {current.revision}:")
        for line in changes or ["no changes"]:
            console.print(f"  {line}")

    _run(_with_store(nats_url(data_dir), run))


@config_app.command()
def apply(
    file: Path = FileArg,
    reason: str = typer.Option("", help="Why (kept in the audit trail)."),
    actor: str = typer.Option("", help="Who (default: the login name)."),
    api_url: str | None = ApiUrl,
    data_dir: str = DataDir,
) -> None:
    """Validate FILE, store it as the next revision (services pick it up live) and audit it; GPU types
    given quota that the running fleet lacks are warned about."""
    check_fleet(_validated(file), api_url, data_dir)
    text = read_file(file, "the tenancy file")
    who = f"operator:{actor or getpass.getuser()}"

    async def run(store: ConfigStore) -> None:
        revision, changes = await store.apply(text, who, reason)
        if not changes:
            console.print(f"no changes; revision {revision} stays in force")
            return
        console.print(f"applied as revision {revision}:")
        for line in changes:
            console.print(f"  {line}")

    _run(_with_store(nats_url(data_dir), run))


class TenancyUnknown(Exception):
    """The tenancy in force could not be read (no stack found, NATS not reachable)."""


def tenants_in_force(data_dir: str) -> tuple[int, list[str]] | None:
    """The revision and tenant names of the tenancy in force; None when none is applied (any tenant may
    submit); :class:`TenancyUnknown` saying why when it cannot be read."""
    from trainyard.cli.settings import cli_settings
    from trainyard.local.state import read_state

    settings = cli_settings()
    if settings.given("nats_url"):
        url = settings.nats_url
    else:
        state = read_state(find_data_dir(data_dir))
        if state is None:
            raise TenancyUnknown("no running `trainyard up` found here and TRAINYARD_NATS_URL is not set")
        url = state.nats_url

    async def read():  # type: ignore[no-untyped-def]
        import asyncio

        from trainyard.bus import Bus
        from trainyard.config.store import ConfigStore

        bus = await asyncio.wait_for(Bus.connect(url, "trainyard-cli"), 10)
        try:
            return await (await ConfigStore.open(bus)).current()
        finally:
            await bus.close()

    try:
        current = _run(read())
    except Exception as err:
        from trainyard.redaction import redact

        raise TenancyUnknown(redact(f"cannot read it from NATS at {url} ({err})")) from err
    if current is None:
        return None
    return current.revision, [t.name for o in current.config.organisations for t in o.teams]


@config_app.command()
def show(data_dir: str = DataDir) -> None:
    """Print the tenancy configuration in force."""

    async def run(store: ConfigStore) -> None:
        current = await store.current()
        if current is None:
            console.print("no tenancy configuration is in force: any tenant may submit, first in first out")
            return
        text = current.text if current.text.endswith("\n") else current.text + "\n"
        sys.stdout.write(f"# revision {current.revision}\n{text}")  # as written: never wrapped when piped

    _run(_with_store(nats_url(data_dir), run))
