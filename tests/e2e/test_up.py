"""``trainyard up`` and the CLI against a real stack: the signals that stop
the whole stack, one stack per data directory, and submitting from a file or
being told at once why a job was rejected."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest
from click.testing import Result
from typer.testing import CliRunner

from trainyard.bus import Bus
from trainyard.cli.main import app
from trainyard.config.store import ConfigStore
from trainyard.local import LocalStack
from trainyard.local.lock import LockInfo, pid_alive, read_ports
from trainyard.testing.tenancy import one_team

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


def wait_until(condition, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def trainyard_up(data_dir: Path, log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "trainyard.cli.main",
                "up",
                "--data-dir",
                str(data_dir),
                "--nodes",
                "2",
                "--agents",
                "2",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "COLUMNS": "200", "HOME": str(data_dir.parent)},  # its ~/.config is the test's
        )


@pytest.mark.parametrize(
    "sig",
    [
        pytest.param(signal.SIGTERM, id="SIGTERM stops every process of the stack"),
        pytest.param(signal.SIGHUP, id="SIGHUP (the terminal closing) stops every process of the stack"),
    ],
)
def test_a_signal_stops_the_whole_stack_and_a_second_start_is_refused_meanwhile(
    tmp_path: Path, sig: signal.Signals
) -> None:
    data_dir, log = tmp_path / "data", tmp_path / "up.log"
    up = trainyard_up(data_dir, log)
    try:
        wait_until(lambda: "Trainyard is up" in log.read_text() or up.poll() is not None, 180, "the stack to start")
        output = log.read_text()
        assert up.poll() is None, output
        for name in (
            "nats-server",
            "redis-server",
            "admission",
            "placement",
            "health",
            "accounting",
            "gateway",
            "emulator",
            "agent-a00",
            "agent-a01",
        ):
            assert f"{name} ready" in output, output
        lock = msgspec.json.decode((data_dir / "stack.lock").read_bytes(), type=LockInfo)
        children = {name: child.pid for name, child in lock.children.items()}
        assert set(children) == {
            "nats-server",
            "redis-server",
            "admission",
            "placement",
            "health",
            "accounting",
            "gateway",
            "emulator",
            "agent-a00",
            "agent-a01",
        }
        assert lock.pid == up.pid and lock.ports == read_ports(data_dir)
        # the addresses are printed just after "Trainyard is up"
        wait_until(lambda: f"127.0.0.1:{lock.ports['http']}" in log.read_text(), 60, "the API address to be printed")
        wait_until(lambda: "bus users" in log.read_text(), 60, "the credentials file to be named")
        # No password of any bus user, admin's included, reaches the terminal (or a log of it).
        credentials = msgspec.json.decode((data_dir / "bus" / "credentials.json").read_bytes())
        passwords = [user["password"] for users in credentials.values() for user in users]
        assert passwords and not [p for p in passwords if p in log.read_text()]
        # The admin token is made, kept private, and found by the CLI by itself.
        wait_until(lambda: "admin token" in log.read_text(), 60, "the admin token to be printed")
        assert (data_dir / "admin-token").stat().st_mode & 0o777 == 0o600
        listed = cli("jobs", "--data-dir", str(data_dir))
        assert listed.exit_code == 0, listed.output
        refused = cli("--token", "ty_0123456789abcdef_" + "x" * 43, "jobs", "--data-dir", str(data_dir))
        assert refused.exit_code == 1 and "unknown API token" in refused.output

        second = subprocess.run(
            [sys.executable, "-m", "trainyard.cli.main", "up", "--data-dir", str(data_dir)],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "COLUMNS": "300", "HOME": str(data_dir.parent)},
        )
        assert second.returncode == 1
        assert f"already running (pid {up.pid}" in second.stderr and f"http {lock.ports['http']}" in second.stderr

        up.send_signal(sig)
        wait_until(lambda: up.poll() is not None, 120, "trainyard up to exit")
        wait_until(lambda: not any(pid_alive(pid) for pid in children.values()), 60, "every child process to be gone")
        assert up.returncode == 0, log.read_text()
        assert not (data_dir / "state.json").exists()
        assert (data_dir / "stack.lock").read_bytes() == b""
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGTERM)
            up.wait(60)


ACME_ONLY = one_team("acme", gpus=128)


def cli(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


async def apply_tenancy(stack: LocalStack) -> None:
    assert stack.nats
    bus = await Bus.connect(stack.nats.admin_url, "e2e")
    try:
        await (await ConfigStore.open(bus)).apply(ACME_ONLY, actor="test:e2e", reason="only acme")
    finally:
        await bus.close()


def test_submit_from_a_file_takes_the_tenant_from_it_and_a_rejection_is_shown_with_exit_status_1(
    stack: LocalStack,
) -> None:
    asyncio.run(apply_tenancy(stack))

    from_file = cli(
        "submit", "-f", str(ROOT / "examples" / "rl-job.yaml"), "--data-dir", str(stack.data_dir), "--job-id", "rl-1"
    )
    assert from_file.exit_code == 0, from_file.output
    assert from_file.output.strip().splitlines()[0] == "rl-1"
    shown = cli("job", "rl-1", "--json", "--data-dir", str(stack.data_dir))
    assert '"tenant": "acme"' in shown.output and '"queue": "default"' in shown.output

    # Admission follows the tenancy key: until it has read it, a stranger is accepted.
    attempts: list = []

    def rejected():  # type: ignore[no-untyped-def]
        result = cli(
            "submit",
            "--tenant",
            "globex",
            "--gpus",
            "1",
            "--data-dir",
            str(stack.data_dir),
            "--job-id",
            f"stranger-{len(attempts)}",
        )
        attempts.append(result)
        assert result.exit_code in (0, 1), result.output
        return result if result.exit_code == 1 else None

    result = wait_until(rejected, 60, "a job of an unknown tenant to be rejected at submit")
    assert "rejected" in result.output
    assert "tenant: unknown tenant 'globex'" in result.output


def test_an_admin_hands_out_a_researcher_token_from_the_cli_and_revokes_it(stack: LocalStack) -> None:
    where = ("--data-dir", str(stack.data_dir))
    created = cli("auth", "token", "create", "--name", "alice", "--role", "researcher", "--tenant", "acme", *where)
    assert created.exit_code == 0, created.output
    token = created.stdout.strip().splitlines()[-1]
    assert token.startswith("ty_")

    submitted = cli("--token", token, "submit", "--tenant", "acme", "--gpus", "1", "--job-id", "alices", *where)
    assert submitted.exit_code == 0, submitted.output
    refused = cli("--token", token, "submit", "--tenant", "globex", "--gpus", "1", *where)
    assert refused.exit_code == 1 and "acts only for tenant 'acme'" in refused.output

    listed = cli("auth", "token", "list", "--json", *where)
    [alice] = [t for t in json.loads(listed.stdout) if t["name"] == "alice"]
    assert cli("auth", "token", "revoke", alice["id"], *where).exit_code == 0
    after = cli("--token", token, "jobs", *where)
    assert after.exit_code == 1 and "revoked" in after.output
