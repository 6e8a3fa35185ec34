"""A node agent that executes runs, over a real nats-server: it registers as
an executing node with its address, reads its orders from WORK through its
own durable consumer, runs real processes, reports on its reports subject,
names its runs in heartbeats and answers ``logs`` requests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from trainyard.agent import control
from trainyard.agent.running import RunningAgent
from trainyard.bus import Bus, ensure_streams
from trainyard.domain.node import NodeInfo
from trainyard.events import decode_node_event, subjects
from trainyard.events.nodes import NodeHeartbeat, NodeRegistered
from trainyard.events.work import (
    ProcessesStarted,
    ProcessExited,
    ProcessLaunch,
    StartRun,
    StopRun,
    WorkReport,
    decode_work,
)
from trainyard.gpu import FakeGpuBackend
from trainyard.local.servers import Server
from trainyard.testing.waiting import eventually

NODE = NodeInfo("n1", "local", "H100", 2, address="127.0.0.1", executes=True)


@pytest.fixture
async def agent(bus: Bus, tmp_path: Path) -> AsyncIterator[RunningAgent]:
    agent = RunningAgent.build(
        bus,
        NODE,
        FakeGpuBackend(2, clock=time.time),
        tmp_path / "state",
        executor_options={"poll_s": 0.05},
        heartbeat_interval_s=0.1,
    )
    stop = asyncio.Event()
    task = asyncio.ensure_future(agent.run(stop))
    yield agent
    for run in list(agent.executor.runs.values()):
        agent.executor.stop(run, "SIGKILL", 0, "cancelled")
    stop.set()
    await asyncio.wait_for(task, 10)


class Reports:
    def __init__(self) -> None:
        self.got: list[WorkReport] = []

    async def on(self, msg) -> None:  # type: ignore[no-untyped-def]
        message = decode_work(msg.data)
        assert isinstance(message, (ProcessesStarted, ProcessExited)) or type(message).__name__ == "CheckpointWritten"
        self.got.append(message)  # type: ignore[arg-type]
        await msg.ack()

    async def wait(self, kind: type, count: int = 1) -> list[WorkReport]:
        async def check() -> list[WorkReport] | None:
            found = [r for r in self.got if isinstance(r, kind)]
            return found if len(found) >= count else None

        return await eventually(check, 30, what=f"{count} {kind.__name__}")


def start(run_id: str, *processes: ProcessLaunch, node_id: str = "n1") -> StartRun:
    return StartRun(
        at=time.time(), job_id="j-1", tenant="acme", run_id=run_id, node_id=node_id, attempt=1,
        cluster="local", processes=list(processes),
    )  # fmt: skip


def rank(r: int, script: str) -> ProcessLaunch:
    return ProcessLaunch(rank=r, role="trainer", replica=r, gpus=[r], argv=["sh", "-c", script], env={"RANK": str(r)})


async def test_an_order_on_the_nodes_subject_runs_and_is_reported_on_work(bus: Bus, agent: RunningAgent) -> None:
    reports = Reports()
    sub = await bus.js.subscribe(subjects.work_reports("local", "n1"), stream="WORK", cb=reports.on)
    order = start(
        "run-1", rank(0, "echo hello from $RANK; exec sleep 60"), rank(1, "echo hello from $RANK; exec sleep 60")
    )
    await bus.publish(subjects.work_orders("local", "n1"), order, msg_id="order-1")
    await bus.publish(subjects.work_orders("local", "n1"), order, msg_id="order-1-again")  # redelivered: a no-op

    started = (await reports.wait(ProcessesStarted))[0]
    assert isinstance(started, ProcessesStarted) and started.ranks == [0, 1] and started.boot_id == agent.boot_id
    beat = await _next_heartbeat(bus)
    assert beat.running_runs == ["run-1"]

    request = control.ControlRequest(op="logs", node_id="n1", job_id="j-1", attempt=1, rank=1)
    reply = await _ask(bus, request)
    assert reply.ok and reply.data == b"hello from 1\n" and reply.details["next_offset"] == "13"
    missing = await _ask(bus, control.ControlRequest(op="logs", node_id="n1", job_id="j-1", attempt=2, rank=1))
    assert not missing.ok and "no log of rank 1 of attempt 2" in missing.message
    tail = await _ask(bus, control.ControlRequest(op="logs", node_id="n1", job_id="j-1", attempt=1, rank=0, offset=-5))
    assert tail.ok and tail.data == b"om 0\n" and tail.details["offset"] == "8"
    on_logs = control.agent_logs_subject("local", "n1")
    logs_only = await _ask(
        bus, control.ControlRequest(op="logs", node_id="n1", job_id="j-1", attempt=1, rank=1), on_logs
    )
    assert logs_only.ok and logs_only.data == b"hello from 1\n"
    refused = await _ask(bus, control.ControlRequest(op="check", node_id="n1"), on_logs)
    assert not refused.ok and "only logs requests" in refused.message

    await bus.publish(
        subjects.work_orders("local", "n1"),
        StopRun(at=time.time(), job_id="j-1", tenant="acme", run_id="run-1", node_id="n1", reason="cancelled"),
        msg_id="stop-1",
    )
    exits = await reports.wait(ProcessExited, 2)
    assert {(e.rank, e.signal, e.stopped) for e in exits} == {(0, "SIGTERM", "cancelled"), (1, "SIGTERM", "cancelled")}  # type: ignore[union-attr]
    assert [r for r in reports.got if isinstance(r, ProcessesStarted)] == [started]
    info = await bus.js.consumer_info("WORK", "agent-n1")
    assert info.config.filter_subject == subjects.work_orders("local", "n1")
    await sub.unsubscribe()


async def test_the_agent_registers_as_an_executing_node_with_its_address(bus: Bus, tmp_path: Path) -> None:
    sub = await bus.js.subscribe(subjects.node("local", "n1"), stream="NODES")
    agent = RunningAgent.build(bus, NODE, FakeGpuBackend(2, clock=time.time), tmp_path / "state")
    stop = asyncio.Event()
    task = asyncio.ensure_future(agent.run(stop))
    try:
        msg = await sub.next_msg(timeout=10)
        registered = decode_node_event(msg.data)
        assert isinstance(registered, NodeRegistered)
        assert (registered.node.executes, registered.node.address) == (True, "127.0.0.1")
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


@pytest.mark.parametrize(
    ("order", "reason"),
    [
        pytest.param(start("run-x", rank(0, "true"), node_id="n2"), "for node 'n2'", id="an order for another node"),
        pytest.param(
            start("run-x", rank(0, "true"), rank(0, "true")), "ranks must be distinct", id="two processes of one rank"
        ),
    ],
)
async def test_an_order_the_agent_cannot_use_is_dead_lettered_and_runs_nothing(
    bus: Bus, agent: RunningAgent, order: StartRun, reason: str
) -> None:
    dead = await bus.js.subscribe(subjects.deadletter("WORK"), stream="DEADLETTER")
    await bus.publish(subjects.work_orders("local", "n1"), order, msg_id="x")
    msg = await dead.next_msg(timeout=20)
    assert reason in msg.headers["Trainyard-Reason"]
    assert agent.executor.runs == {} and not (agent.executor.state_dir / "runs" / "run-x").exists()


async def _next_heartbeat(bus: Bus) -> NodeHeartbeat:
    sub = await bus.nc.subscribe(subjects.telemetry("local", "n1"))
    try:
        while True:
            msg = await sub.next_msg(timeout=10)
            event = msgspec.json.decode(msg.data)
            if event.get("type") == "NodeHeartbeat":
                return msgspec.json.decode(msg.data, type=NodeHeartbeat)
    finally:
        await sub.unsubscribe()


async def _ask(bus: Bus, request: control.ControlRequest, subject: str | None = None) -> control.ControlReply:
    subject = subject or control.agent_control_subject("local", "n1")
    msg = await bus.nc.request(subject, control.encode(request), timeout=10)
    return control.decode_reply(msg.data)


async def test_an_agent_started_before_the_streams_exist_registers_once_they_do(
    nats_server: Server, tmp_path: Path
) -> None:
    bus = await Bus.connect(nats_server.url, name="agent-before-streams")
    agent = RunningAgent.build(bus, NODE, FakeGpuBackend(2, clock=time.time), tmp_path / "state")
    stop = asyncio.Event()
    task = asyncio.ensure_future(agent.run(stop))
    try:
        await eventually(_not_done(task), what="the agent waits")  # no NODES stream: it keeps trying
        await ensure_streams(bus.js)
        sub = await bus.js.subscribe(subjects.node("local", "n1"), stream="NODES")
        registered = decode_node_event((await sub.next_msg(timeout=30)).data)
        assert isinstance(registered, NodeRegistered) and registered.node.executes
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await bus.close()


def _not_done(task: asyncio.Future[None]):  # type: ignore[no-untyped-def]
    async def check() -> bool:
        return not task.done()

    return check
