"""trainyard up's supervisor: per-process backoff that resets, servers restarted in place."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nats

from trainyard.local.servers import start_nats
from trainyard.local.supervisor import Backoff, Supervisor, restart_server


def test_backoff_doubles_while_a_process_keeps_exiting_and_resets_after_a_healthy_period() -> None:
    b = Backoff(first_s=1.0, max_s=30.0, healthy_s=60.0)
    now, waits = 0.0, []
    b.started(now)
    for _ in range(7):  # each run lasts 1 s, then it waits out the backoff and starts again
        now += 1.0
        waits.append(b.exited(now))
        now += waits[-1]
        b.started(now)
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert b.exited(now + 61.0) == 1.0  # up for 61 s: the next exit counts as the first


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def exiting() -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait()
    return proc


def running() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


class Stack:
    """The parts of a LocalStack the supervisor uses, with real processes."""

    def __init__(self) -> None:
        self.procs = {"admission": exiting(), "placement": running()}
        self.nats = None
        self.redis = None
        self.started: list[str] = []

    def start_service(self, name: str) -> subprocess.Popen:
        self.started.append(name)
        self.procs[name] = running()
        return self.procs[name]

    def stop(self) -> None:
        for p in self.procs.values():
            p.kill()
            p.wait()


def die(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait()


def test_each_process_waits_out_its_own_backoff_without_holding_the_others() -> None:
    clock, stack, said = FakeClock(), Stack(), []
    sup = Supervisor(stack, say=said.append, clock=clock)
    try:
        sup.check()  # admission has exited: due in 1 s
        assert sup.due == {"admission": 1.0} and stack.started == []
        clock.now = 1.0
        sup.check()
        assert stack.started == ["admission"]
        die(stack.procs["admission"])  # exits again at once: due in 2 s
        clock.now = 1.5
        sup.check()
        assert sup.due == {"admission": 3.5}
        die(stack.procs["placement"])  # placement dies meanwhile: its own first backoff, 1 s
        sup.check()
        assert sup.due == {"admission": 3.5, "placement": 2.5}
        clock.now = 2.5
        sup.check()
        assert stack.started == ["admission", "placement"] and set(sup.due) == {"admission"}
        clock.now = 3.5
        sup.check()
        assert stack.started == ["admission", "placement", "admission"] and sup.due == {}
        assert sup.restarts == {"admission": 2, "placement": 1}
        assert "admission exited with status 3; restarting in 1s" in said
    finally:
        stack.stop()


def test_a_killed_nats_server_comes_back_on_its_port_with_its_data(tmp_path: Path) -> None:
    server = start_nats(tmp_path / "nats")

    async def publish() -> None:
        nc = await nats.connect(server.url)
        js = nc.jetstream()
        await js.add_stream(name="KEEP", subjects=["keep.>"])
        await js.publish("keep.one", b"1")
        await nc.close()

    async def count() -> int:
        nc = await nats.connect(server.url)
        info = await nc.jetstream().stream_info("KEEP")
        await nc.close()
        return info.state.messages

    import asyncio

    try:
        asyncio.run(publish())
        old_pid = server.proc.pid
        server.proc.kill()
        server.proc.wait()
        restart_server(server)
        assert server.proc.pid != old_pid and server.proc.poll() is None
        assert asyncio.run(count()) == 1
    finally:
        server.stop()
