"""``trainyard auth token create|list|revoke`` (through the gateway, as the
caller's token allows) and ``trainyard auth bootstrap`` (the first admin token
of an installation, written straight into the NATS KV bucket)."""

from __future__ import annotations

import getpass
import re
import time

import typer
from rich.console import Console

from trainyard.cli.client import ApiError, Client
from trainyard.cli.jobs import calling
from trainyard.cli.output import AsJson, Column, NoHeaders, Output, OutputOpt, chosen, print_items

auth_app = typer.Typer(help="API tokens: create, list, revoke; the first admin token.", no_args_is_help=True)
token_app = typer.Typer(help="API tokens for people, portals and services.", no_args_is_help=True)
auth_app.add_typer(token_app, name="token")

console = Console()
err_console = Console(stderr=True)

DataDir = typer.Option(".trainyard", "--data-dir", envvar="TRAINYARD_DATA_DIR", help="Where `up` keeps its state.")
ApiUrl = typer.Option(None, "--api-url", help="Gateway URL (default: the stack found from here; see docs/cli.md).")
ExpiresIn = typer.Option(None, "--expires-in", help="Lifetime, e.g. 30d, 12h, 90m, 2w (default: until revoked).")

_DURATION = re.compile(r"(?P<n>\d+(?:\.\d+)?)\s*(?P<unit>[smhdw])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 7 * 86_400}


def parse_duration(text: str) -> float:
    """Seconds in ``30d``, ``12h``, ``90m``, ``3600s`` or ``2w``; ``ValueError`` saying how to write it."""
    match = _DURATION.fullmatch(text.strip().lower())
    if not match or float(match["n"]) <= 0:
        raise ValueError(f"{text!r} is not a duration: write a number and a unit, e.g. 30d, 12h, 90m, 3600s or 2w")
    return float(match["n"]) * _UNITS[match["unit"]]


def _when(at: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(at)) if at else "-"


def _call(api_url: str | None, data_dir: str, method: str, path: str, **kwargs):  # type: ignore[no-untyped-def]
    try:
        return Client.for_cli(api_url, data_dir).request(method, path, **kwargs)
    except ApiError as err:
        err_console.print(f"[red]error:[/red] {err}", markup=True, highlight=False)
        raise typer.Exit(1) from err


def _expiry(expires_in: str | None) -> float | None:
    if expires_in is None:
        return None
    try:
        return parse_duration(expires_in)
    except ValueError as err:
        err_console.print(f"[red]error:[/red] --expires-in: {err}")
        raise typer.Exit(2) from err


def _show_created(token: str, info: dict) -> None:  # type: ignore[type-arg]
    scope = f", tenant {info['tenant']}" if info.get("tenant") else ""
    expires = f", expires {_when(info.get('expires_at'))}" if info.get("expires_at") else ""
    err_console.print(f"created token {info['id']} ({info['name']}: {info['role']}{scope}{expires}).")
    err_console.print("The secret is shown only now; keep it safe. Use it as:")
    err_console.print(f"  export TRAINYARD_TOKEN={token}", highlight=False)
    err_console.print(f"  curl -H 'Authorization: Bearer {token}' ...", highlight=False)
    print(token)


@token_app.command("create")
def create(
    name: str = typer.Option(..., "--name", help="What the token is for: 1-64 letters, digits, '_' or '-'."),
    role: str = typer.Option(..., "--role", help="researcher, tenant-admin, operator, finance or admin."),
    tenant: str | None = typer.Option(None, "--tenant", help="The tenant of a researcher or tenant-admin token."),
    expires_in: str | None = ExpiresIn,
    force: bool = typer.Option(False, "--force", help="Create it even for a tenant the tenancy in force lacks."),
    api_url: str | None = ApiUrl,
    data_dir: str = DataDir,
) -> None:
    """Create an API token; prints the secret once (on stdout).  A --tenant that the tenancy in force does
    not have is refused (its jobs would all be rejected) unless --force is given."""
    if tenant is not None:
        _check_tenant(tenant, force, data_dir)
    body = {"name": name, "role": role, "tenant": tenant, "expires_in_s": _expiry(expires_in)}
    created = _call(api_url, data_dir, "POST", "/v1/auth/tokens", json=body)
    _show_created(created["token"], created["info"])


def _check_tenant(tenant: str, force: bool, data_dir: str) -> None:
    """Refuse (exit 1) a tenant the applied tenancy lacks unless ``force``; say so when it cannot be checked."""
    from trainyard.cli.config import TenancyUnknown, tenants_in_force

    try:
        found = tenants_in_force(data_dir)
    except TenancyUnknown as err:
        err_console.print(f"note: tenant {tenant!r} not checked against the tenancy in force: {err}", highlight=False)
        return
    if found is None or tenant in found[1]:
        return  # no tenancy applied: any tenant may submit
    revision, known = found
    from trainyard.shapes import did_you_mean

    hint = did_you_mean(tenant, known) or ";"
    said = f"tenant {tenant!r} is not in the tenancy in force (revision {revision}){hint} known tenants: "
    said += ", ".join(sorted(known)) or "none"
    if force:
        err_console.print(f"[yellow]warning:[/yellow] {said}; creating the token anyway (--force)", highlight=False)
        return
    err_console.print(
        f"[red]error:[/red] {said}. Its jobs would all be rejected: apply a tenancy that has it "
        "(trainyard config apply FILE), or pass --force",
        highlight=False,
    )
    raise typer.Exit(1)


def _state(t: dict, now: float) -> str:  # type: ignore[type-arg]
    expired = t.get("expires_at") is not None and t["expires_at"] <= now
    return "revoked" if t["revoked"] else "expired" if expired else "active"


@token_app.command("list")
def list_tokens(
    output: Output = OutputOpt,
    as_json: bool = AsJson,
    no_headers: bool = NoHeaders,
    api_url: str | None = ApiUrl,
    data_dir: str = DataDir,
) -> None:
    """List API tokens (never their secrets); -o wide|json|yaml|name, --no-headers."""
    tokens, _ = calling(api_url, data_dir, lambda client: client.walk("/v1/auth/tokens", "tokens", {}, None))
    now = time.time()
    columns = [
        Column("id", lambda t: t["id"]),
        Column("name", lambda t: t["name"]),
        Column("role", lambda t: t["role"]),
        Column("tenant", lambda t: t.get("tenant") or "-"),
        Column("created", lambda t: _when(t["created_at"])),
        Column("by", lambda t: t["created_by"]),
        Column("expires", lambda t: _when(t.get("expires_at"))),
        Column("state", lambda t: _state(t, now)),
    ]
    print_items(tokens, columns, chosen(output, as_json), no_headers)


@token_app.command("revoke")
def revoke(token_id: str, api_url: str | None = ApiUrl, data_dir: str = DataDir) -> None:
    """Revoke an API token: every gateway refuses it within about a second."""
    revoked = _call(api_url, data_dir, "DELETE", f"/v1/auth/tokens/{token_id}")
    console.print(f"revoked token {revoked['id']} ({revoked['name']})")


@auth_app.command("bootstrap")
def bootstrap(
    name: str = typer.Option("admin", "--name", help="Name of the admin token."),
    expires_in: str | None = ExpiresIn,
    nats_url: str | None = typer.Option(
        None,
        "--nats-url",
        envvar="TRAINYARD_NATS_URL",
        help="NATS of the installation (default: the running `trainyard up`).",
    ),
    data_dir: str = DataDir,
) -> None:
    """Create an admin token directly in the NATS KV bucket, for an installation
    that has none yet (needs NATS credentials that may write the bucket)."""
    import asyncio

    from trainyard.auth import Role, TokenStore
    from trainyard.bus import Bus
    from trainyard.bus.audit import audit
    from trainyard.cli.config import nats_url as stack_nats_url

    url = nats_url or stack_nats_url(data_dir)
    lifetime = _expiry(expires_in)
    actor = f"bootstrap:{getpass.getuser()}"

    async def run() -> tuple[str, dict]:  # type: ignore[type-arg]
        bus = await Bus.connect(url, "trainyard-cli")
        try:
            store = await TokenStore.open(bus.js)
            record, token = await store.create(name, Role.ADMIN, None, created_by=actor, expires_in_s=lifetime)
            await audit(
                bus,
                actor,
                "token.create",
                record.id,
                "bootstrap",
                details={"name": name, "role": "admin"},
                record_id=f"audit:token:create:{record.id}",
            )
            return token, {"id": record.id, "name": record.name, "role": "admin", "expires_at": record.expires_at}
        finally:
            await bus.close()

    try:
        token, info = asyncio.run(run())
    except Exception as err:
        from trainyard.redaction import redact

        err_console.print(f"[red]error:[/red] {redact(f'cannot create the token through NATS at {url}: {err}')}")
        raise typer.Exit(1) from err
    _show_created(token, info)
