"""Each node agent connects as its own NATS user (``agent-<node>``): against a
real nats-server started with the generated users, agent n01 publishes its own
reports, telemetry and registration and reads its own orders, and can do none
of that for n02; the run dispatcher (placement) writes orders and reads reports."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from nats.js.api import ConsumerConfig

from trainyard.bus import Bus, PublishDenied, ensure_streams
from trainyard.bus.permissions import inbox_prefix
from trainyard.events import subjects
from trainyard.events.work import CheckpointWritten, StopRun
from trainyard.local.credentials import ADMIN, Credentials, new_credentials, write_server_files
from trainyard.local.servers import Server, start_nats

CLUSTER = "local"


@pytest.fixture(scope="module")
def credentials() -> Credentials:
    return new_credentials().with_agents(["n01", "n02"])


@pytest.fixture
def locked_nats(tmp_path: Path, credentials: Credentials) -> Iterator[Server]:
    (tmp_path / "bus").mkdir()
    conf, _ = write_server_files(tmp_path / "bus", credentials, cluster=CLUSTER)
    admin = credentials.nats_user(ADMIN)
    server = start_nats(tmp_path / "nats", config_file=conf, admin=(admin.name, admin.password))
    yield server
    server.stop()


Connect = Callable[[str], Awaitable[Bus]]


@pytest.fixture
async def connect(locked_nats: Server, credentials: Credentials) -> AsyncIterator[Connect]:
    opened: list[Bus] = []

    async def as_user(name: str) -> Bus:
        user = credentials.nats_user(name)
        bus = await Bus.connect(
            locked_nats.url, f"test-{name}", user=user.name, password=user.password, inbox_prefix=inbox_prefix(name)
        )
        opened.append(bus)
        return bus

    await ensure_streams((await as_user(ADMIN)).js)
    yield as_user
    for bus in opened:
        await bus.close()


def report(node: str) -> CheckpointWritten:
    return CheckpointWritten(at=1.0, job_id="j1", tenant="acme", run_id="r1", node_id=node, step=3)


def order(node: str) -> StopRun:
    return StopRun(at=1.0, job_id="j1", tenant="acme", run_id="r1", node_id=node, reason="cancelled")


def test_each_node_gets_its_own_agent_user_once(credentials: Credentials) -> None:
    again = credentials.with_agents(["n01", "n03"])
    names = [u.name for u in again.nats if u.role == "agent"]
    assert names == ["agent-n01", "agent-n02", "agent-n03"]
    assert again.nats_user("agent-n01") == credentials.nats_user("agent-n01")  # password kept
    assert all(u.name != "agent-n01" for u in again.redis)  # agents need no Redis


@pytest.mark.parametrize(
    ("subject", "allowed"),
    [
        pytest.param(subjects.work_reports(CLUSTER, "n01"), True, id="n01 reports on its own runs"),
        pytest.param(subjects.work_reports(CLUSTER, "n02"), False, id="n01 cannot report as n02"),
        pytest.param(subjects.work_orders(CLUSTER, "n01"), False, id="n01 cannot order itself"),
        pytest.param(subjects.telemetry(CLUSTER, "n01"), True, id="n01 sends its own telemetry"),
        pytest.param(subjects.telemetry(CLUSTER, "n02"), False, id="n01 cannot heartbeat for n02"),
        pytest.param(subjects.node(CLUSTER, "n01"), True, id="n01 registers itself"),
        pytest.param(subjects.node(CLUSTER, "n02"), False, id="n01 cannot register or drain n02"),
        pytest.param(subjects.job("acme", "j1", "agent"), False, id="n01 cannot write job events at all"),
        pytest.param(subjects.job("acme", "j1", "placement"), False, id="n01 cannot write the dispatcher's events"),
    ],
)
async def test_an_agent_publishes_only_as_its_own_node(connect: Connect, subject: str, allowed: bool) -> None:
    agent = await connect("agent-n01")
    if allowed:
        ack = await agent.publish(subject, report("n01"), msg_id=f"n01:{subject}")
        assert not ack.duplicate
    else:
        with pytest.raises(PublishDenied):
            await agent.publish(subject, report("n01"), msg_id=f"n01:{subject}")


async def test_an_agent_reads_its_own_orders_and_never_another_nodes(
    connect: Connect, caplog: pytest.LogCaptureFixture
) -> None:
    placement, n01 = await connect("placement"), await connect("agent-n01")
    for node in ("n01", "n02"):
        await placement.publish(subjects.work_orders(CLUSTER, node), order(node), msg_id=f"stop:{node}")
    mine = await n01.js.pull_subscribe(subjects.work_orders(CLUSTER, "n01"), durable="agent-n01", stream="WORK")
    [msg] = await mine.fetch(1, timeout=5.0)
    assert msg.subject == subjects.work_orders(CLUSTER, "n01")
    await msg.ack()
    with caplog.at_level(logging.WARNING, logger="trainyard.bus.connection"):
        # Its own durable filtered to n02's orders, or n02's durable: neither may be created.
        for durable in ("agent-n01", "agent-n02"):
            config = ConsumerConfig(durable_name=durable, filter_subject=subjects.work_orders(CLUSTER, "n02"))
            with pytest.raises((PublishDenied, asyncio.TimeoutError)):
                await n01.js.add_consumer("WORK", config, timeout=1.0)
        # A consumer on the whole stream, with no durable name or filter, neither.
        with pytest.raises((PublishDenied, asyncio.TimeoutError)):
            await n01.js.add_consumer("WORK", ConsumerConfig(), timeout=1.0)
    assert any("permissions violation" in r.getMessage() for r in caplog.records)


async def test_the_dispatcher_reads_reports_through_its_own_durable(connect: Connect) -> None:
    placement, n02 = await connect("placement"), await connect("agent-n02")
    await n02.publish(subjects.work_reports(CLUSTER, "n02"), report("n02"), msg_id="ckpt")
    sub = await placement.js.pull_subscribe(
        subjects.work_reports_of(CLUSTER), durable=f"dispatcher-reports-{CLUSTER}", stream="WORK"
    )
    [msg] = await sub.fetch(1, timeout=5.0)
    assert msg.subject == subjects.work_reports(CLUSTER, "n02")
