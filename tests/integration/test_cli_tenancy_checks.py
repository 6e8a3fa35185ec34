"""The CLI checks what it is given against the tenancy in force, read from a real
JetStream: a token for a tenant the tenancy lacks is refused (unless --force), and a
tenancy file's keys and names are all checked at once, each with its path.

The gateway's address is a closed port: a command that got past its checks says it
cannot reach the API, one refused by them never tries."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainyard.bus import Bus, ensure_streams
from trainyard.cli.main import app
from trainyard.config.store import ConfigStore
from trainyard.local.servers import Server
from trainyard.testing.tenancy import one_team

CLOSED = "http://127.0.0.1:9"
NOT_SENT = "cannot reach the Trainyard API"


def run(nats: Server | None, *args: str) -> tuple[int, str]:
    env = {"TRAINYARD_API_URL": CLOSED, "TRAINYARD_TOKEN": "", "COLUMNS": "300"}
    if nats is not None:
        env["TRAINYARD_NATS_URL"] = nats.url
    result = CliRunner().invoke(app, list(args), env=env)
    return result.exit_code, " ".join(result.output.split())


def apply(nats: Server, text: str) -> None:
    async def go() -> None:
        bus = await Bus.connect(nats.url, "test")
        try:
            await ensure_streams(bus.js)
            await (await ConfigStore.open(bus)).apply(text, actor="test", reason="")
        finally:
            await bus.close()

    asyncio.run(go())


def create_token(nats: Server | None, tenant: str, *more: str) -> tuple[int, str]:
    return run(nats, "auth", "token", "create", "--name", "alice", "--role", "researcher", "--tenant", tenant, *more)


def test_a_token_for_a_tenant_the_tenancy_lacks_is_refused_naming_the_known_ones(nats_server: Server) -> None:
    apply(nats_server, one_team("acme"))

    code, out = create_token(nats_server, "acmee")

    assert code == 1
    assert "tenant 'acmee' is not in the tenancy in force (revision 1); did you mean 'acme'?" in out
    assert "known tenants: acme" in out and "--force" in out and NOT_SENT not in out


def test_with_force_the_token_is_asked_for_after_a_warning(nats_server: Server) -> None:
    apply(nats_server, one_team("acme"))

    code, out = create_token(nats_server, "globex", "--force")

    assert code == 1 and NOT_SENT in out  # the request was made: only the closed port stopped it
    assert "warning: tenant 'globex' is not in the tenancy in force (revision 1); known tenants: acme" in out


@pytest.mark.parametrize("tenancy", [pytest.param(None, id="no tenancy applied"), pytest.param("acme", id="known")])
def test_a_tenant_the_tenancy_has_or_any_tenant_without_one_is_not_held_up(
    nats_server: Server, tenancy: str | None
) -> None:
    if tenancy:
        apply(nats_server, one_team(tenancy))

    code, out = create_token(nats_server, "acme")

    assert code == 1 and NOT_SENT in out and "tenancy in force" not in out and "not checked" not in out


def test_without_a_stack_the_token_says_the_tenant_was_not_checked(tmp_path: Path) -> None:
    code, out = create_token(None, "acme", "--data-dir", str(tmp_path))

    assert code == 1 and NOT_SENT in out
    assert "note: tenant 'acme' not checked against the tenancy in force: no running `trainyard up` found" in out


def test_config_validate_lists_every_problem_and_says_the_fleet_was_not_checked(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(one_team("acme"))
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        one_team("acme")
        .replace("node_pool:", "nodepool:")
        .replace("priority: 500", "priorty: 500")
        .replace("  - name: lab", "  - name: lab\n    wieght: 2")
    )

    code, out = run(None, "config", "validate", str(bad))
    assert code == 1 and f"{bad}: 5 problem(s)" in out
    for said in (
        "flavors[0].nodepool: unknown field 'nodepool'; did you mean 'node_pool'?",
        "flavors[0].node_pool: is required",
        "priority_classes[0].priorty: unknown field 'priorty'; did you mean 'priority'?",
        "priority_classes[0].priority: is required",
        "organisations[0].wieght: unknown field 'wieght'; did you mean 'weight'?",
    ):
        assert said in out

    code, out = run(None, "config", "validate", str(good))
    assert code == 0 and f"{good}: valid (1 organisations, 1 queues)" in out
    assert f"note: the fleet was not checked: {NOT_SENT} at {CLOSED}" in out
