"""The locked bus against a real nats-server and Redis started with the
generated users: every credential may publish only what its role produces,
only admin writes the configuration, a refused publish fails at once and
leaves the connection working, and Redis keeps readers from writing."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
import redis.exceptions
from redis.asyncio import Redis

from trainyard.bus import (
    Bus,
    ConsumerSpec,
    Delivery,
    Outcome,
    PublishDenied,
    PublishRequest,
    deadletters,
    ensure_streams,
    run_consumer,
)
from trainyard.bus.permissions import SERVICES, inbox_prefix
from trainyard.config.store import ConfigStore
from trainyard.events import subjects
from trainyard.events.jobs import CancelJob
from trainyard.local.credentials import ADMIN, Credentials, new_credentials, write_server_files
from trainyard.local.servers import Server, start_nats, start_redis
from trainyard.observability.metrics import LedgerMetrics
from trainyard.testing.fakes import Scripted
from trainyard.testing.tenancy import one_team

CONFIG = one_team("acme", gpus=8)


@pytest.fixture(scope="module")
def credentials() -> Credentials:
    return new_credentials(tenants=["acme", "beta"])


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, credentials: Credentials) -> tuple[Path, Path]:
    return write_server_files(tmp_path_factory.mktemp("bus"), credentials, cluster="local")


@pytest.fixture
def locked_nats(tmp_path: Path, files: tuple[Path, Path], credentials: Credentials) -> Iterator[Server]:
    admin = credentials.nats_user(ADMIN)
    server = start_nats(tmp_path / "nats", config_file=files[0], admin=(admin.name, admin.password))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def locked_redis(
    tmp_path_factory: pytest.TempPathFactory, files: tuple[Path, Path], credentials: Credentials
) -> Iterator[Server]:
    admin = credentials.redis_user(ADMIN)
    server = start_redis(tmp_path_factory.mktemp("redis"), acl_file=files[1], admin=(admin.name, admin.password))
    yield server
    server.stop()


Connect = Callable[[str], Awaitable[Bus]]


@pytest.fixture
async def connect(locked_nats: Server, credentials: Credentials) -> AsyncIterator[Connect]:
    """Connect as a named user, the way a service does (its own inbox prefix);
    the streams are declared by admin first."""
    opened: list[Bus] = []

    async def as_user(name: str) -> Bus:
        user = credentials.nats_user(name)
        bus = await Bus.connect(
            locked_nats.url,
            f"test-{name}",
            user=user.name,
            password=user.password,
            inbox_prefix=inbox_prefix(user.name),
        )
        opened.append(bus)
        return bus

    admin = await as_user(ADMIN)
    await ensure_streams(admin.js)
    yield as_user
    for bus in opened:
        await bus.close()


def cancel(tenant: str = "acme", job_id: str = "j-1") -> CancelJob:
    return CancelJob(at=1.0, job_id=job_id, tenant=tenant)


def job(writer: str, tenant: str = "acme") -> str:
    return subjects.job(tenant, "j-1", writer)


@pytest.mark.parametrize(
    ("user", "subject", "allowed"),
    [
        pytest.param("portal-acme", subjects.intake("acme"), True, id="a portal submits on its own tenant's intake"),
        pytest.param("portal-acme", subjects.intake("beta"), False, id="a portal cannot submit for another tenant"),
        pytest.param("portal-acme", job("admission"), False, id="a portal cannot publish a decision"),
        pytest.param("portal-acme", job("agent"), False, id="a portal cannot forge a RunSucceeded"),
        pytest.param("portal-acme", subjects.node("local", "n1"), False, id="a portal cannot drain a node"),
        pytest.param("portal-acme", subjects.audit("config"), False, id="a portal cannot write the audit trail"),
        pytest.param("admission", job("admission"), True, id="admission publishes its decisions"),
        pytest.param("admission", job("placement"), False, id="admission cannot place"),
        pytest.param("placement", job("placement"), True, id="placement publishes placements"),
        pytest.param("placement", job("admission"), False, id="placement cannot publish an admission decision"),
        pytest.param("placement", subjects.intake("acme"), False, id="placement cannot submit"),
        pytest.param("emulator", job("agent"), True, id="node agents report runs"),
        pytest.param("emulator", job("health"), False, id="node agents cannot fail runs as health"),
        pytest.param("emulator", subjects.node("local", "n1"), True, id="node agents register nodes of their cluster"),
        pytest.param("emulator", subjects.node("other", "n1"), False, id="node agents cannot touch another cluster"),
        pytest.param("health", job("health"), True, id="health fails runs on lost nodes"),
        pytest.param("health", job("agent"), False, id="health cannot report a run as its agent"),
        pytest.param("health", subjects.node("local", "n1"), True, id="health publishes node state changes"),
        pytest.param("accounting", job("agent"), False, id="accounting, a reader, cannot publish job events"),
        pytest.param("accounting", subjects.intake("acme"), False, id="accounting, a reader, cannot submit"),
        pytest.param("accounting", subjects.node("local", "n1"), False, id="accounting, a reader, cannot drain"),
        pytest.param("gateway", subjects.intake("beta"), True, id="the gateway submits for any tenant"),
        pytest.param("gateway", job("admission"), False, id="the gateway cannot publish a decision"),
        pytest.param("gateway", job("agent"), False, id="the gateway cannot forge a RunSucceeded"),
    ],
)
async def test_a_user_publishes_only_what_its_role_produces(
    connect: Connect, user: str, subject: str, allowed: bool
) -> None:
    bus = await connect(user)
    admin = await connect(ADMIN)
    stream = (
        "INTAKE"
        if ".intake." in subject
        else "NODES"
        if ".nodes." in subject
        else "AUDIT"
        if ".audit." in subject
        else "JOBS"
    )
    before = (await admin.js.stream_info(stream)).state.messages
    if allowed:
        ack = await bus.publish(subject, cancel(), msg_id=f"{user}:{subject}")
        assert ack.stream == stream
    else:
        with pytest.raises(PublishDenied):
            await bus.publish(subject, cancel(), msg_id=f"{user}:{subject}")
    assert (await admin.js.stream_info(stream)).state.messages == before + allowed


async def test_a_refused_publish_is_logged_and_the_connection_keeps_working(
    connect: Connect, caplog: pytest.LogCaptureFixture
) -> None:
    portal = await connect("portal-acme")
    with caplog.at_level(logging.WARNING, logger="trainyard.bus.connection"):
        with pytest.raises(PublishDenied, match="trainyard.jobs.acme.j-1.agent"):
            await portal.publish(job("agent"), cancel(), msg_id="forged")
        ack = await portal.publish(subjects.intake("acme"), cancel(), msg_id="after")
    assert ack.seq == 1 and portal.nc.is_connected and portal.generation == 0
    assert any("permissions violation" in r.getMessage() for r in caplog.records)


async def test_only_admin_writes_the_configuration_bucket_and_services_read_it(connect: Connect) -> None:
    admin = await ConfigStore.open(await connect(ADMIN))
    revision, _ = await admin.apply(CONFIG, actor="test:admin")
    admission = await ConfigStore.open(await connect("admission"))  # it follows the configuration
    with pytest.raises(PublishDenied):
        await admission.kv.put("tenancy", b"organisations: []")
    for name in ("placement", "health", "accounting", "gateway", "emulator", "portal-acme"):
        bus = await connect(name)
        with pytest.raises(PublishDenied):
            await bus.publish_raw("$KV.trainyard-config.tenancy", b"organisations: []", {"Nats-Msg-Id": name})
    current = await admission.current()
    assert current is not None and current.revision == revision and current.text == CONFIG


async def test_a_consumer_cannot_take_messages_from_another_services_durable_consumer(
    connect: Connect, caplog: pytest.LogCaptureFixture
) -> None:
    admission, accounting, placement = (
        await connect("admission"),
        await connect("accounting"),
        await connect("placement"),
    )
    mine = await accounting.js.pull_subscribe(subjects.JOBS_ALL, durable="accounting", stream="JOBS")
    await admission.publish(job("admission"), cancel(), msg_id="decision")
    with caplog.at_level(logging.WARNING, logger="trainyard.bus.connection"):
        theirs = await placement.js.pull_subscribe(subjects.JOBS_ALL, durable="accounting", stream="JOBS")
        with pytest.raises(asyncio.TimeoutError):
            await theirs.fetch(1, timeout=1.0)
    assert any("permissions violation" in r.getMessage() for r in caplog.records)
    [msg] = await mine.fetch(1, timeout=5.0)
    assert msg.subject == job("admission")


async def test_a_user_cannot_read_another_users_replies(connect: Connect, caplog: pytest.LogCaptureFixture) -> None:
    admin, portal = await connect(ADMIN), await connect("portal-acme")
    seen: list[bytes] = []

    async def on_msg(msg) -> None:  # type: ignore[no-untyped-def]
        seen.append(msg.data)

    with caplog.at_level(logging.WARNING, logger="trainyard.bus.connection"):
        await portal.nc.subscribe(f"{inbox_prefix('admission')}.>", cb=on_msg)
        await portal.nc.flush()
        await admin.nc.publish(f"{inbox_prefix('admission')}.x", b"a reply for admission")
        await admin.nc.flush()
        await portal.nc.flush()
    assert any("violation for subscription" in r.getMessage() for r in caplog.records)
    assert seen == []


def test_every_service_has_a_nats_and_a_redis_user(credentials: Credentials) -> None:
    for service in SERVICES:
        assert credentials.nats_user(service).role == service
        assert credentials.redis_user(service).role == service


# --- Redis ---------------------------------------------------------------------------------


def redis_as(server: Server, credentials: Credentials, name: str | None) -> Redis:
    if name is None:
        return Redis.from_url(server.url, decode_responses=True)
    user = credentials.redis_user(name)
    return Redis.from_url(server.url, username=user.name, password=user.password, decode_responses=True)


async def test_a_redis_client_without_a_user_is_refused(locked_redis: Server, credentials: Credentials) -> None:
    client = redis_as(locked_redis, credentials, None)
    try:
        with pytest.raises(redis.exceptions.AuthenticationError):
            await client.get("ty:job:j-1")
    finally:
        await client.aclose()


@pytest.mark.parametrize(
    ("user", "command", "allowed"),
    [
        pytest.param("admission", ("SET", "ty:x", "1"), True, id="a projection writer writes under the prefix"),
        pytest.param("admission", ("SET", "other:x", "1"), False, id="a writer cannot write outside the prefix"),
        pytest.param("placement", ("FLUSHALL",), False, id="a writer cannot wipe Redis"),
        pytest.param("gateway", ("CONFIG", "GET", "*"), False, id="a writer cannot read or change the configuration"),
        pytest.param("accounting", ("GET", "ty:x"), True, id="a reader reads"),
        pytest.param("accounting", ("SET", "ty:x", "2"), False, id="a reader cannot write"),
        pytest.param("accounting", ("EVAL", "return 1", "0"), False, id="a reader cannot run scripts"),
        pytest.param("admin", ("FLUSHDB",), True, id="admin may rebuild from scratch"),
    ],
)
async def test_a_redis_user_runs_only_the_commands_of_its_role(
    locked_redis: Server, credentials: Credentials, user: str, command: tuple[str, ...], allowed: bool
) -> None:
    client = redis_as(locked_redis, credentials, user)
    try:
        if allowed:
            await client.execute_command(*command)
        else:
            with pytest.raises(redis.exceptions.NoPermissionError):
                await client.execute_command(*command)
    finally:
        await client.aclose()


async def test_a_consumer_whose_publish_is_refused_keeps_consuming(connect: Connect) -> None:
    """A handler whose outcome carries a publish its user may not make is
    retried like any failure; the consumer loop goes on with the next messages."""
    admission, accounting = await connect("admission"), await connect("accounting")

    def decide(d: Delivery[bytes]) -> Outcome:
        if d.subject == job("admission") and d.delivered == 1:  # accounting, a reader, tries to write a decision
            return Outcome.done(PublishRequest(d.subject, cancel(), "not-mine"))
        return Outcome.done()

    handler = Scripted(decide)

    def handled() -> list[str]:
        return [d.subject for d in handler.seen if d.subject != job("admission") or d.delivered > 1]

    stop = asyncio.Event()
    spec = ConsumerSpec(stream="JOBS", durable="accounting", filter_subject=subjects.JOBS_ALL, retry_delay_s=0.1)
    loop = asyncio.create_task(run_consumer(accounting, spec, handler, stop))
    try:
        await admission.publish(job("admission"), cancel(), msg_id="first")
        await admission.publish(subjects.job("acme", "j-2", "admission"), cancel(job_id="j-2"), msg_id="second")
        deadline = asyncio.get_running_loop().time() + 30
        while len(handled()) < 2 and not loop.done() and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        assert not loop.done()
        assert sorted(handled()) == sorted([job("admission"), subjects.job("acme", "j-2", "admission")])
        assert (await admission.js.stream_info("JOBS")).state.messages == 2  # the denied publish is not there
    finally:
        stop.set()
        await loop


async def test_the_gateway_reads_and_replays_dead_letters_and_accounting_reads_its_lag(connect: Connect) -> None:
    admin = await connect(ADMIN)
    original = await admin.publish_raw(subjects.intake("acme"), b"{}", {"Nats-Msg-Id": "s-1"})
    headers = {
        "Trainyard-Reason": "gave up",
        "Trainyard-Subject": subjects.intake("acme"),
        "Trainyard-Stream-Seq": str(original.seq),
        "Trainyard-Size": "2",
        "Nats-Msg-Id": "dl-1",
    }
    await admin.publish_raw(subjects.deadletter("INTAKE"), b"{}", headers)
    gateway = await connect("gateway")
    [letter] = await deadletters.listing(gateway)
    assert (await deadletters.counts(gateway))["INTAKE"] == 1
    replayed = await deadletters.replay(gateway, letter.seq)
    assert replayed.subject == subjects.intake("acme")
    await admin.publish_raw(job("admission"), b"{}", {"Nats-Msg-Id": "e-1"})
    accounting = await connect("accounting")
    lag = LedgerMetrics()
    await lag.refresh(accounting, now=lambda: time.time() + 60)
    assert lag.registry.get_sample_value("trainyard_ledger_lag_events") == 1
    assert lag.registry.get_sample_value("trainyard_ledger_lag_seconds") > 0
