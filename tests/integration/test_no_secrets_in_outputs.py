"""No credential of the stack in anything the finance commands write or say:
the capacity report (HTML, CSV, JSON), the chargeback export (CSV, Parquet)
and the CLI's error messages, produced the way the stack's owner runs them
(``state.json`` of a locked stack, whose NATS and Redis URLs carry the admin
credential).  Each output is searched for every NATS and Redis password and
the admin token."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import msgspec
import pytest
from redis import Redis

from trainyard.domain.node import NodeInfo
from trainyard.ledger import Ledger
from trainyard.local.credentials import ADMIN, BUS_DIR, Credentials, ensure_credentials, write_server_files
from trainyard.local.servers import Server, ServerError, free_port, start_redis, url_with_user, wait_jetstream
from trainyard.local.state import StackState, write_state
from trainyard.redaction import redact
from trainyard.reports import capacity_report
from trainyard.settings import Settings

ADMIN_TOKEN = "ty_admin_0123456789abcdefSECRETtoken"


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[Path, Credentials, Server]]:
    """A data directory as ``trainyard up`` leaves it (credentials, state, admin
    token) with a locked Redis that holds one registered node."""
    data_dir = tmp_path / "data"
    credentials = ensure_credentials(data_dir / BUS_DIR, tenants=["acme"])
    _, acl = write_server_files(data_dir / BUS_DIR, credentials)
    admin = credentials.redis_user(ADMIN)
    redis = start_redis(tmp_path / "redis", acl_file=acl, admin=(admin.name, admin.password))
    client = Redis.from_url(redis.url, username=admin.name, password=admin.password)
    node = NodeInfo(node_id="n1", cluster="local", gpu_type="H100", gpus=8)
    client.hset(f"{Settings().redis_prefix}nodeinfo", "n1", msgspec.json.encode(node))
    client.close()
    (data_dir / "admin-token").write_text(ADMIN_TOKEN)
    ledger = Ledger(f"sqlite:///{data_dir / 'ledger.db'}")
    ledger.create_schema()
    ledger.close()
    state = StackState(
        api_url=f"http://127.0.0.1:{free_port()}",
        grpc_target="127.0.0.1:1",
        nats_url=f"nats://127.0.0.1:{free_port()}",
        redis_url=redis.url,
        ledger_url=f"sqlite:///{data_dir / 'ledger.db'}",
        pid=os.getpid(),
        locked_bus=True,
    )
    write_state(data_dir, state)
    yield data_dir, credentials, redis
    redis.stop()


def secrets_of(credentials: Credentials) -> list[str]:
    users = [*credentials.nats, *credentials.redis]
    return [u.password for u in users] + [ADMIN_TOKEN]


def leaks(text: bytes, secrets: list[str]) -> list[str]:
    return [s[:4] + "..." for s in secrets if s.encode() in text]


def run(*args: str) -> tuple[int, bytes]:
    """The ``trainyard`` command in a process of its own: what it prints on both streams."""
    done = subprocess.run(
        [sys.executable, "-c", "from trainyard.cli.main import app; app()", *args],
        capture_output=True,
        timeout=120,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )
    return done.returncode, done.stdout + done.stderr


def test_reports_exports_and_errors_hold_no_credential(
    stack: tuple[Path, Credentials, Server], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data_dir, credentials, redis = stack
    secrets = secrets_of(credentials)
    monkeypatch.chdir(tmp_path)
    for name in ("TRAINYARD_LEDGER_URL", "TRAINYARD_REDIS_URL", "TRAINYARD_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    outputs: dict[str, bytes] = {}

    out = tmp_path / "report"
    code, said = run("report", "capacity", "--period", "2026-11", "--out", str(out), "--data-dir", str(data_dir))
    assert code == 0, said
    outputs["report capacity (terminal)"] = said
    for path in sorted(out.iterdir()):
        outputs[f"report capacity: {path.name}"] = path.read_bytes()
    assert b"the NODES projection at redis://" in outputs["report capacity: capacity.html"]  # named, without secret
    report = capacity_report([], [], {"H100": 8}, 1_790_000_000.0, 1_790_086_400.0, 1_790_086_400.0)
    outputs["capacity report as JSON"] = msgspec.json.encode(report)

    for fmt in ("csv", "parquet"):
        target = tmp_path / f"chargeback.{fmt}"
        args = ("export", "chargeback", "--period", "2026-11", "--format", fmt, "-o", str(target))
        code, said = run(*args, "--data-dir", str(data_dir))
        assert code == 0, said
        outputs[f"chargeback {fmt} (terminal)"] = said
        outputs[f"chargeback.{fmt}"] = target.read_bytes()

    # Errors: Redis gone (its URL, with the admin credential, is in the message), a bad ledger URL.
    redis.stop()
    code, said = run("report", "capacity", "--period", "2026-11", "--out", str(out), "--data-dir", str(data_dir))
    assert code == 1 and b"cannot read the NODES projection at redis://" in said
    outputs["report capacity with Redis down (error)"] = said
    ledger = f"postgresql://ledger:{secrets[0]}@127.0.0.1:{free_port()}/ledger"
    code, said = run("export", "chargeback", "--period", "2026-11", "--ledger-url", ledger, "--data-dir", str(data_dir))
    assert code == 1 and b"cannot read the ledger at postgresql://ledger:***@127.0.0.1:" in said, said
    outputs["chargeback with an unreachable ledger (error)"] = said

    found = {name: leaks(text, secrets) for name, text in outputs.items() if leaks(text, secrets)}
    assert found == {}


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        pytest.param("redis://admin:s3cret@127.0.0.1:6379/0", "redis://admin:***@127.0.0.1:6379/0", id="a Redis URL"),
        pytest.param(
            "nats://a:p@h1:4222,nats://a:p@h2:4222", "nats://a:***@h1:4222,nats://a:***@h2:4222", id="a server list"
        ),
        pytest.param("postgresql://u:p/a:ss@db/x", "postgresql://u:***@db/x", id="a password holding / and :"),
        pytest.param("host=db password=hunter2 user=u", "host=db password=*** user=u", id="a libpq parameter"),
        pytest.param("http://127.0.0.1:8080/v1/jobs", "http://127.0.0.1:8080/v1/jobs", id="a URL without one"),
    ],
)
def test_redact_keeps_the_address_and_hides_the_secret(text: str, shown: str) -> None:
    assert redact(text) == shown


def test_the_banner_of_trainyard_up_names_its_servers_without_a_password(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The lines ``trainyard up`` prints (and its log keeps) once the stack is
    up, for a stack whose ledger is a database reached with a password."""
    from trainyard.cli.up import _print_banner

    secret = "ledger-Pa55word"
    stack = SimpleNamespace(
        nats=object(),
        redis=SimpleNamespace(url="redis://127.0.0.1:6379"),
        api_url="http://127.0.0.1:8080",
        grpc_port=50051,
        nats_url="nats://127.0.0.1:4222",
        nats_nodes=[object()],
        nats_replicas=1,
        nats_sync="default",
        credentials=object(),
        data_dir=tmp_path,
        metrics_ports={"gateway": 9100},
        ledger_url=f"postgresql://trainyard:{secret}@db.internal:5432/ledger",
        admin_token_created=True,
    )
    _print_banner(stack, nodes=2, gpus=8, racks=1, agents=4, agent_gpus=8)
    said = capsys.readouterr()
    assert "postgresql://trainyard:***@db.internal:5432/ledger" in said.out
    assert secret not in said.out + said.err


@pytest.fixture
def not_nats() -> Iterator[int]:
    """A port that takes connections and closes them at once, as no NATS server would."""
    server = socket.create_server(("127.0.0.1", 0))

    def refuse() -> None:
        with contextlib.suppress(OSError):
            while True:
                server.accept()[0].close()

    threading.Thread(target=refuse, daemon=True).start()
    yield server.getsockname()[1]
    server.close()


def test_trainyard_up_says_which_nats_did_not_answer_without_its_password(not_nats: int) -> None:
    """``trainyard up`` waits for JetStream on the admin's URL; when it does
    not answer, the error (on the terminal and in the log) names the server."""
    secret = "nats-Adm1n-pass"
    url = url_with_user(f"nats://127.0.0.1:{not_nats}", "admin", secret)
    with pytest.raises(ServerError) as failed:
        wait_jetstream(url, timeout=0.5)
    assert "nats://admin:***@127.0.0.1" in str(failed.value) and secret not in str(failed.value)
