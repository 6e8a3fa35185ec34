"""``trainyard agent`` as a real process, killed with SIGKILL in the middle of
a run and started again over the same state directory: the run's process
lives on, the new agent reattaches and reports its exit once, and a
redelivered StartRun starts no second copy."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainyard.agent.processes import alive, read_pids
from trainyard.bus import Bus
from trainyard.events import subjects
from trainyard.events.work import ProcessesStarted, ProcessExited, ProcessLaunch, StartRun, StopRun, decode_work
from trainyard.local.servers import Server
from trainyard.testing.waiting import eventually

TRAINYARD = str(Path(sys.executable).with_name("trainyard"))


class Agents:
    """Start ``trainyard agent`` processes; each is stopped at the end."""

    def __init__(self, nats_url: str, state_dir: Path, log_dir: Path) -> None:
        self.nats_url = nats_url
        self.state_dir = state_dir
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> subprocess.Popen[bytes]:
        env = {"PATH": os.defpath, "HOME": str(self.log_dir), "TRAINYARD_NATS_URL": self.nats_url}
        log = open(self.log_dir / f"agent-{len(self.procs)}.log", "wb")  # noqa: SIM115 - the agent writes it
        proc = subprocess.Popen(
            [TRAINYARD, "agent", "--node-id", "n1", "--fake-gpus", "2", "--state-dir", str(self.state_dir)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(20)


@pytest.fixture
def agents(nats_server: Server, tmp_path: Path) -> Iterator[Agents]:
    found = Agents(nats_server.url, tmp_path / "state", tmp_path)
    yield found
    found.stop_all()


def start_order(workdir: Path) -> StartRun:
    script = "echo up; while [ ! -e go ]; do sleep 0.05; done; echo done"
    launch = ProcessLaunch(
        rank=0, role="trainer", replica=0, gpus=[0], argv=["sh", "-c", script], env={}, working_dir=str(workdir)
    )
    return StartRun(
        at=time.time(), job_id="j-1", tenant="acme", run_id="run-1", node_id="n1", attempt=1, cluster="local",
        processes=[launch],
    )  # fmt: skip


async def test_an_agent_killed_mid_run_reattaches_and_never_starts_a_second_copy(
    bus: Bus, agents: Agents, tmp_path: Path
) -> None:
    got: list[object] = []

    async def on(msg) -> None:  # type: ignore[no-untyped-def]
        got.append(decode_work(msg.data))
        await msg.ack()

    sub = await bus.js.subscribe(subjects.work_reports("local", "n1"), stream="WORK", cb=on)
    workdir = tmp_path / "work"
    workdir.mkdir()
    order = start_order(workdir)
    orders = subjects.work_orders("local", "n1")

    first = agents.start()
    await bus.publish(orders, order, msg_id="start-1")
    await eventually(_has(got, ProcessesStarted), timeout=60, what="the run started")
    pids = read_pids(agents.state_dir / "runs" / "run-1" / "rank-0")
    assert pids is not None
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    assert alive(pids.pid, pids.start), "the run's process outlives its agent"

    agents.start()
    await bus.publish(orders, order, msg_id="start-1-again")  # a redelivered start
    tombstone = StopRun(at=time.time(), job_id="j-2", tenant="acme", run_id="probe", node_id="n1", reason="cancelled")
    await bus.publish(orders, tombstone, msg_id="probe")
    await eventually(_exists(agents.state_dir / "runs" / "probe"), timeout=60, what="the new agent read its orders")
    assert len(list((agents.state_dir / "runs").iterdir())) == 2 and alive(pids.pid, pids.start)

    (workdir / "go").touch()
    await eventually(_has(got, ProcessExited), timeout=60, what="the exit reported")
    await eventually(_exists(agents.state_dir / "runs" / "run-1" / "done"), what="the run is over")
    exits = [r for r in got if isinstance(r, ProcessExited)]
    assert [(e.rank, e.exit_code, e.stopped) for e in exits] == [(0, 0, None)]
    assert len([r for r in got if isinstance(r, ProcessesStarted)]) == 1
    assert (workdir / "go").exists() and "done" in exits[0].log_tail
    await sub.unsubscribe()


def _has(got: list[object], kind: type):  # type: ignore[no-untyped-def]
    async def check() -> bool:
        return any(isinstance(r, kind) for r in got)

    return check


def _exists(path: Path):  # type: ignore[no-untyped-def]
    async def check() -> bool:
        return path.exists()

    return check
