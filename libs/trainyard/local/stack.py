"""Start NATS, Redis, every service as its own process, the emulated cluster
and the gateway; stop them all cleanly.

Each process is started with ``sys.executable`` so the stack runs from
whatever environment ``trainyard`` was installed into.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import msgspec

from trainyard.testing.servers import Server, free_port, start_nats, start_redis, wait_port

#: Process name -> the command after ``python``.
SERVICES: dict[str, list[str]] = {
    "admission": ["-m", "trainyard_admission"],
    "placement": ["-m", "trainyard_placement"],
    "health": ["-m", "trainyard_health"],
    "accounting": ["-m", "trainyard_accounting"],
    "gateway": ["-m", "trainyard_gateway"],
    "emulator": ["-m", "trainyard.cli.main", "emulate", "run"],
}


class StackConfig(msgspec.Struct):
    data_dir: str = ".trainyard"
    nats_port: int = 0  # 0 picks a free port
    redis_port: int = 0
    http_port: int = 0
    grpc_port: int = 0
    nodes: int = 16
    gpus_per_node: int = 8
    racks: int = 2
    cluster: str = "local"
    heartbeat_interval_s: float = 1.0
    heartbeat_timeout_s: float = 5.0
    log_level: str = "INFO"


class StackState(msgspec.Struct):
    """What ``trainyard up`` writes so other commands can find the stack."""

    api_url: str
    grpc_target: str
    nats_url: str
    redis_url: str
    ledger_url: str
    pid: int


def state_path(data_dir: str | Path) -> Path:
    return Path(data_dir) / "state.json"


def read_state(data_dir: str | Path) -> StackState | None:
    path = state_path(data_dir)
    if not path.exists():
        return None
    return msgspec.json.decode(path.read_bytes(), type=StackState)


class LocalStack:
    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self.data_dir = Path(config.data_dir).resolve()
        self.nats: Server | None = None
        self.redis: Server | None = None
        self.procs: dict[str, subprocess.Popen] = {}
        self.env: dict[str, str] = {}
        self.http_port = config.http_port or free_port()
        self.grpc_port = config.grpc_port or free_port()

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def ledger_url(self) -> str:
        return f"sqlite:///{self.data_dir / 'ledger.db'}"

    def start_servers(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.nats = start_nats(self.data_dir / "nats", self.config.nats_port or None)
        self.redis = start_redis(self.data_dir / "redis", self.config.redis_port or None)
        self.env = {
            **os.environ,
            "TRAINYARD_NATS_URL": self.nats.url,
            "TRAINYARD_REDIS_URL": self.redis.url,
            "TRAINYARD_CLUSTER": self.config.cluster,
            "TRAINYARD_LEDGER_URL": self.ledger_url,
            "TRAINYARD_GATEWAY_HTTP_PORT": str(self.http_port),
            "TRAINYARD_GATEWAY_GRPC_PORT": str(self.grpc_port),
            "TRAINYARD_HEARTBEAT_INTERVAL_S": str(self.config.heartbeat_interval_s),
            "TRAINYARD_HEARTBEAT_TIMEOUT_S": str(self.config.heartbeat_timeout_s),
            "TRAINYARD_EMULATOR_NODES": str(self.config.nodes),
            "TRAINYARD_EMULATOR_GPUS": str(self.config.gpus_per_node),
            "TRAINYARD_EMULATOR_RACKS": str(self.config.racks),
            "TRAINYARD_LOG_LEVEL": self.config.log_level,
            "PYTHONUNBUFFERED": "1",
        }

    def start_service(self, name: str) -> subprocess.Popen:
        logs = self.data_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, *SERVICES[name]], env=self.env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        self.procs[name] = proc
        return proc

    def start(self, services: list[str] | None = None, wait: float = 60.0) -> None:
        self.start_servers()
        for name in services or list(SERVICES):
            self.start_service(name)
        if services is None or "gateway" in services:
            wait_port(self.http_port, timeout=wait, proc=self.procs["gateway"], name="gateway")
        self.write_state()

    def write_state(self) -> None:
        assert self.nats and self.redis
        state = StackState(
            api_url=self.api_url, grpc_target=f"127.0.0.1:{self.grpc_port}", nats_url=self.nats.url,
            redis_url=self.redis.url, ledger_url=self.ledger_url, pid=os.getpid(),
        )  # fmt: skip
        state_path(self.data_dir).write_bytes(msgspec.json.format(msgspec.json.encode(state)))

    def kill(self, name: str) -> None:
        """SIGKILL one service, as a crash would."""
        proc = self.procs[name]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()

    def stop_service(self, name: str, timeout: float = 15.0) -> None:
        proc = self.procs.get(name)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def exited(self) -> dict[str, int]:
        return {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}

    def stop(self) -> None:
        for name in reversed(list(self.procs)):
            self.stop_service(name)
        if self.nats:
            self.nats.stop()
        if self.redis:
            self.redis.stop()
        state_path(self.data_dir).unlink(missing_ok=True)

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.data_dir / "logs" / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
