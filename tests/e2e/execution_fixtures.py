"""Helpers of the execution e2e tests: a stack whose node agents run real
processes, the job's processes as ``/proc`` shows them, what the agents wrote
about each rank, and the CLI run as a subprocess."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from trainyard.bus import Bus
from trainyard.events import JobEvent, decode_job_event, subjects
from trainyard.events.work import WorkReport, decode_work
from trainyard.local import LocalStack, StackConfig
from trainyard.testing.streams import read_raw

ROOT = Path(__file__).resolve().parents[2]
ALLREDUCE = str(ROOT / "examples" / "distributed" / "allreduce.py")
_TICKS = os.sysconf("SC_CLK_TCK")


def _boot_time() -> float:
    """When the machine booted, to the tick: /proc/<pid>/stat counts start times from it
    (/proc/stat's btime is rounded to the second)."""
    return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)


BOOT = _boot_time()


@contextmanager
def agent_stack(directory: Path, agents: int, agent_gpus: int, heartbeat_timeout_s: float) -> Iterator[LocalStack]:
    """The whole stack with ``agents`` node agents and no emulated node."""
    s = LocalStack(
        StackConfig(
            data_dir=str(directory / "stack"),
            agents=agents,
            nodes=0,
            agent_gpus=agent_gpus,
            heartbeat_timeout_s=heartbeat_timeout_s,
            log_level=os.environ.get("E2E_LOG_LEVEL", "WARNING"),
        )
    )
    try:
        s.start()
        api = Api(s)
        api.wait(lambda: len(api.get("/v1/nodes")["nodes"]) == agents, 60, "every agent to register its node")
        yield s
    finally:
        for name in s.procs:
            print(f"--- {name} (exit {s.procs[name].poll()}) ---\n{s.log_tail(name, 40)}")
        s.stop()
        # Stopping an agent leaves its runs alone (as under systemd's KillMode=process): end what is left.
        for proc in job_processes(s):
            with suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
    # On the locked bus every service and agent did its whole job with its own user.
    assert s.nats and s.nats.admin
    refused = [line for line in s.nats.log_path.read_text(errors="replace").splitlines() if "Violation" in line]
    for name in s.procs:
        refused += [f"{name}: {line}" for line in s.log_tail(name, 100_000).splitlines() if "NOPERM" in line]
    assert refused == []


def _read(stack: LocalStack, stream: str, subject: str) -> list[bytes]:
    async def read() -> list[bytes]:
        assert stack.nats
        bus = await Bus.connect(stack.nats.admin_url, "e2e")
        try:
            return [data for _, _, data in await read_raw(bus, stream, subject)]
        finally:
            await bus.close()

    return asyncio.run(read())


def job_events(stack: LocalStack, job_id: str) -> list[JobEvent]:
    """The job's events in JOBS, in order."""
    events = [decode_job_event(data) for data in _read(stack, "JOBS", ">")]
    return [e for e in events if getattr(e, "job_id", None) == job_id]


def work_reports(stack: LocalStack, run_id: str) -> list[WorkReport]:
    """What the agents reported about ``run_id``, in order."""
    reports = [decode_work(data) for data in _read(stack, "WORK", subjects.work_reports_of(stack.config.cluster))]
    return [r for r in reports if isinstance(r, WorkReport) and r.run_id == run_id]


class Api:
    """The gateway's REST API as the stack's admin."""

    def __init__(self, stack: LocalStack) -> None:
        self.http = httpx.Client(base_url=stack.api_url, headers=stack.admin_headers(), timeout=30)

    def get(self, path: str, **params: Any) -> Any:
        r = self.http.get(path, params=params)
        assert r.status_code == 200, r.text
        return r.json()

    def submit(self, body: dict[str, Any]) -> str:
        r = self.http.post("/v1/jobs", json=body)
        assert r.status_code in (200, 201, 202), r.text
        return str(r.json()["job_id"])

    def cancel(self, job_id: str) -> None:
        r = self.http.delete(f"/v1/jobs/{job_id}")
        assert r.status_code in (200, 202), r.text

    def job(self, job_id: str) -> dict[str, Any]:
        return dict(self.get(f"/v1/jobs/{job_id}"))

    def status(self, job_id: str) -> str:
        r = self.http.get(f"/v1/jobs/{job_id}")
        return str(r.json()["status"]) if r.status_code == 200 else ""

    @staticmethod
    def wait(check: Any, timeout: float, what: str) -> Any:
        """Poll ``check()`` every 50 ms until it returns something true."""
        deadline = time.monotonic() + timeout
        while True:
            result = check()
            if result:
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"not true within {timeout}s: {what}")
            time.sleep(0.05)

    def wait_status(self, job_id: str, statuses: set[str], timeout: float = 60) -> str:
        return str(
            self.wait(lambda: (s := self.status(job_id)) in statuses and s, timeout, f"{job_id} to be {statuses}")
        )


def cli(stack: LocalStack, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """``trainyard ARGS --data-dir <the stack's>`` as a subprocess."""
    command = [sys.executable, "-m", "trainyard.cli.main", *args]
    if "--" in command:
        at = command.index("--")
        command[at:at] = ["--data-dir", str(stack.data_dir)]
    else:
        command += ["--data-dir", str(stack.data_dir)]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=60)


@dataclass(frozen=True)
class Proc:
    """A live process of a job, as ``/proc`` shows it."""

    pid: int
    state: str  # R, S, T, ...
    env: dict[str, str]
    shim: bool  # the shim a rank's command is started through, not the command

    @property
    def rank(self) -> int:
        return int(self.env["RANK"])

    @property
    def run_id(self) -> str:
        return self.env["TRAINYARD_RUN_ID"]

    @property
    def stopped(self) -> bool:
        return self.state in ("T", "t")


def _read_proc(pid: int) -> Proc | None:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    state = stat[stat.rindex(b")") + 2 :].split(b" ", 1)[0].decode()
    if state in ("Z", "X") or b"TRAINYARD_JOB_ID=" not in raw:
        return None
    env = dict(item.decode(errors="replace").partition("=")[::2] for item in raw.split(b"\0") if b"=" in item)
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    return Proc(pid, state, env, shim=any(a.endswith(b"agent/shim.py") for a in argv))


def job_processes(stack: LocalStack, job_id: str | None = None) -> list[Proc]:
    """Every live process (shims included) of ``stack``'s agents whose environment holds
    ``TRAINYARD_JOB_ID=job_id`` (any job's when None)."""
    agents = f"{stack.data_dir / 'agents'}/"
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            proc = _read_proc(int(name))
            if (
                proc is not None
                and proc.env.get("TRAINYARD_CHECKPOINT_DIR", "").startswith(agents)
                and (job_id is None or proc.env.get("TRAINYARD_JOB_ID") == job_id)
            ):
                found.append(proc)
    return found


def commands(stack: LocalStack, job_id: str) -> list[Proc]:
    """The job's commands: its processes less the shims (which run ``python -I -S .../shim.py``)."""
    return [p for p in job_processes(stack, job_id) if not p.shim]


@dataclass(frozen=True)
class RankRecord:
    """What an agent wrote about one rank of a run: when its command started and when it exited."""

    node: str
    rank: int
    pid: int
    started_at: float
    exit: str | None
    exited_at: float | None


def rank_records(stack: LocalStack, run_id: str) -> list[RankRecord]:
    """Every rank of ``run_id`` on every agent, from the agents' state directories."""
    out = []
    for node_dir in sorted((stack.data_dir / "agents").iterdir()):
        run_dir = node_dir / "runs" / run_id
        if not run_dir.is_dir():
            continue
        for rank_dir in sorted(run_dir.glob("rank-*")):
            pid_file, exit_file = rank_dir / "pid", rank_dir / "exit"
            if not pid_file.exists():
                continue
            pid, ticks = pid_file.read_text().split()[:2]
            exit_text = exit_file.read_text().strip() if exit_file.exists() else None
            out.append(
                RankRecord(
                    node=node_dir.name,
                    rank=int(rank_dir.name.removeprefix("rank-")),
                    pid=int(pid),
                    started_at=BOOT + int(ticks) / _TICKS,
                    exit=exit_text,
                    exited_at=exit_file.stat().st_mtime if exit_text is not None else None,
                )
            )
    return out


class Sampler:
    """Samples the live processes of every job in a thread, so a test can look
    at what was alive at the same moment over its whole course."""

    def __init__(self, stack: LocalStack) -> None:
        self.stack = stack
        self.samples: list[tuple[float, list[Proc]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), job_processes(self.stack)))
            self._stop.wait(0.05)
