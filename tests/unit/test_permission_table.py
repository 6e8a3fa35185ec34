"""The permission table, the credentials kept with a stack and the settings
that carry them: who may write which subject, read from the table itself."""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path

import msgspec
import pytest

from trainyard.bus.permissions import ROLES, SERVICES, BusUser, inbox_prefix, nats_config, permissions_for, user_name
from trainyard.events import subjects
from trainyard.local.credentials import ADMIN, ensure_credentials, load_credentials, service_env, write_server_files
from trainyard.local.servers import nats_server_binary
from trainyard.local.stack import StackState, read_state, state_path
from trainyard.settings import ConfigurationError, load_settings
from trainyard.store.acl import redis_acl, rules_for


def matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: ``*`` one token, ``>`` the rest."""
    want, have = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or (token != "*" and token != have[i]):
            return False
    return len(want) == len(have)


def may_publish(role: str, subject: str, tenant: str | None = None) -> bool:
    return any(matches(p, subject) for p in permissions_for(role, tenant, cluster="local").publish)


def publishers(subject: str) -> set[str]:
    """Every role (portals of tenant acme) that may publish ``subject``."""
    return {role for role in ROLES if may_publish(role, subject, "acme" if role == "portal" else None)}


@pytest.mark.parametrize(
    ("subject", "expected"),
    [
        pytest.param(subjects.job("acme", "j-1", "admission"), {"admission", "admin"}, id="only admission decides"),
        pytest.param(subjects.job("acme", "j-1", "placement"), {"placement", "admin"}, id="only placement places"),
        pytest.param(subjects.job("acme", "j-1", "agent"), {"emulator", "admin"}, id="only node agents report runs"),
        pytest.param(
            subjects.job("acme", "j-1", "health"), {"health", "admin"}, id="only health fails runs on lost nodes"
        ),
        pytest.param(
            subjects.intake("acme"), {"portal", "gateway", "admin"}, id="acme's intake: its portal and the gateway"
        ),
        pytest.param(subjects.intake("beta"), {"gateway", "admin"}, id="beta's intake: not acme's portal"),
        pytest.param(subjects.node("local", "n1"), {"emulator", "health", "gateway", "admin"}, id="node events"),
        pytest.param(subjects.telemetry("local", "n1"), {"emulator", "admin"}, id="telemetry: node agents only"),
        pytest.param(subjects.audit("config"), {"gateway", "admin"}, id="config audit records"),
        pytest.param("$KV.trainyard-config.tenancy", {"admin"}, id="only admin writes the configuration"),
        pytest.param("$KV.trainyard-leases.placement.local", {"placement", "admin"}, id="the placement lease"),
        pytest.param("$KV.trainyard-leases.admission.local", {"admission", "admin"}, id="the admission lease"),
        pytest.param("$JS.API.STREAM.UPDATE.JOBS", {"admin"}, id="only admin changes a stream's settings"),
        pytest.param("$JS.API.STREAM.DELETE.JOBS", {"admin"}, id="only admin deletes a stream"),
        pytest.param("$JS.API.STREAM.PURGE.JOBS", {"admin"}, id="only admin purges a stream"),
        pytest.param("$JS.API.STREAM.MSG.DELETE.JOBS", {"admin"}, id="only admin deletes a message"),
        pytest.param(
            "$JS.API.STREAM.MSG.DELETE.DEADLETTER", {"gateway", "admin"}, id="the gateway discards a dead letter"
        ),
        pytest.param("$JS.API.CONSUMER.MSG.NEXT.JOBS.accounting", {"accounting", "admin"}, id="accounting's consumer"),
        pytest.param("$JS.ACK.JOBS.accounting.1.2.3.4.5", {"accounting", "admin"}, id="acks on accounting's consumer"),
        pytest.param("$JS.API.CONSUMER.DELETE.JOBS.accounting", {"admin"}, id="only admin deletes a consumer"),
    ],
)
def test_who_may_publish_a_subject(subject: str, expected: set[str]) -> None:
    assert publishers(subject) == expected


def test_a_reader_publishes_nothing_but_its_dead_letters_and_its_jetstream_calls() -> None:
    own = [p for p in permissions_for("accounting").publish if p.startswith(subjects.PREFIX)]
    assert own == [subjects.deadletter("JOBS")]


def test_a_portal_publishes_on_its_intake_only_and_reads_only_its_own_inbox() -> None:
    perms = permissions_for("portal", "acme")
    assert perms.publish == (subjects.intake("acme"),)
    assert perms.subscribe == ("_INBOX.portal-acme.>",)
    assert not perms.allow_responses


def test_every_user_but_admin_subscribes_only_under_its_own_inbox_or_its_control_subjects() -> None:
    for role in ROLES:
        if role == ADMIN:
            continue
        tenant = "acme" if role == "portal" else None
        inbox = inbox_prefix(user_name(role, tenant)) + ".>"
        others = [s for s in permissions_for(role, tenant).subscribe if s != inbox]
        assert all(s.endswith(".control") for s in others), (role, others)


@pytest.mark.parametrize(
    ("role", "tenant"),
    [
        pytest.param("scheduler", None, id="an unknown role"),
        pytest.param("portal", None, id="a portal without a tenant"),
        pytest.param("admission", "acme", id="a service with a tenant"),
        pytest.param("portal", "acme.beta", id="a tenant that is not one subject token"),
    ],
)
def test_a_bad_role_or_tenant_is_refused(role: str, tenant: str | None) -> None:
    with pytest.raises(ValueError):
        permissions_for(role, tenant)


def test_the_generated_configuration_is_one_nats_server_accepts(tmp_path: Path) -> None:
    users = [BusUser(user_name(r), "pw", r) for r in (*SERVICES, ADMIN)] + [
        BusUser("portal-acme", "pw", "portal", "acme")
    ]
    path = tmp_path / "nats.conf"
    path.write_text(nats_config(users, cluster="local"))
    checked = subprocess.run([nats_server_binary(), "-t", "-c", str(path)], capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stderr


def test_the_redis_acl_turns_the_default_user_off_and_holds_no_password_in_the_clear() -> None:
    acl = redis_acl([BusUser("admission", "s3cret", "admission"), BusUser("portal-acme", "pw", "portal", "acme")])
    assert acl.splitlines()[0].startswith("user default off resetpass ")  # nobody logs in as it
    assert "s3cret" not in acl and "portal-acme" not in acl
    assert "+@write" not in rules_for("accounting") and "-@dangerous" in rules_for("admission")


# --- credentials ----------------------------------------------------------------------------


def test_credentials_are_private_kept_across_starts_and_gain_portals(tmp_path: Path) -> None:
    first = ensure_credentials(tmp_path / "bus")
    again = ensure_credentials(tmp_path / "bus", tenants=["acme"])
    assert again.nats[: len(first.nats)] == first.nats
    assert again.nats_user("portal-acme").role == "portal"
    assert load_credentials(tmp_path / "bus") == again
    assert stat.S_IMODE((tmp_path / "bus").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "bus" / "credentials.json").stat().st_mode) == 0o600
    passwords = [u.password for u in again.nats + again.redis]
    assert len(set(passwords)) == len(passwords)


def test_server_files_keep_passwords_private(tmp_path: Path) -> None:
    credentials = ensure_credentials(tmp_path)
    nats_conf, acl = write_server_files(tmp_path, credentials)
    assert stat.S_IMODE(nats_conf.stat().st_mode) == 0o600
    assert credentials.redis_user(ADMIN).password not in acl.read_text()


def test_a_service_is_given_only_its_own_users(tmp_path: Path) -> None:
    credentials = ensure_credentials(tmp_path)
    env = service_env(credentials, "placement")
    assert env["TRAINYARD_NATS_USER"] == "placement" and env["TRAINYARD_REDIS_USER"] == "placement"
    assert env["TRAINYARD_NATS_PASSWORD"] == credentials.nats_user("placement").password
    settings = load_settings(env)
    assert settings.nats_user == "placement" and settings.redis_password == env["TRAINYARD_REDIS_PASSWORD"]


def test_the_cli_reads_a_locked_stack_as_admin(tmp_path: Path) -> None:
    credentials = ensure_credentials(tmp_path / "bus")
    state = StackState(
        api_url="http://127.0.0.1:1",
        grpc_target="127.0.0.1:2",
        nats_url="nats://127.0.0.1:4222",
        redis_url="redis://127.0.0.1:6379/0",
        ledger_url="sqlite://",
        pid=1,
        locked_bus=True,
    )
    state_path(tmp_path).write_bytes(msgspec.json.encode(state))
    read = read_state(tmp_path)
    assert read is not None
    assert read.nats_url == f"nats://admin:{credentials.nats_user(ADMIN).password}@127.0.0.1:4222"
    assert read.redis_url == f"redis://admin:{credentials.redis_user(ADMIN).password}@127.0.0.1:6379/0"
    assert b"password" not in state_path(tmp_path).read_bytes()
    # A stack started since without users is read as it is.
    state_path(tmp_path).write_bytes(msgspec.json.encode(msgspec.structs.replace(state, locked_bus=False)))
    assert read_state(tmp_path) == msgspec.structs.replace(state, locked_bus=False)


@pytest.mark.parametrize(
    "env",
    [
        pytest.param({"TRAINYARD_NATS_USER": "admission"}, id="a NATS user without a password"),
        pytest.param({"TRAINYARD_REDIS_PASSWORD": "x"}, id="a Redis password without a user"),
        pytest.param({"TRAINYARD_NATS_TLS_CERT": __file__}, id="a client certificate without its key"),
        pytest.param({"TRAINYARD_NATS_TLS_CA": "/nonexistent/ca.pem"}, id="a CA file that is not there"),
        pytest.param({"TRAINYARD_REDIS_TLS_CA": __file__}, id="Redis TLS with a redis:// URL"),
    ],
)
def test_bad_credential_settings_stop_the_process_at_start(env: dict[str, str]) -> None:
    with pytest.raises(ConfigurationError):
        load_settings(env)
