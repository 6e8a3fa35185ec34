"""Start NATS, Redis, every service as its own process, the node agents (and
the emulated cluster when asked) and the gateway; stop them all cleanly.

Each process is started with ``sys.executable`` so the stack runs from
whatever environment ``trainyard`` was installed into.  One stack runs per
data directory (:mod:`trainyard.local.lock`), and it keeps its ports across
restarts.  Each process logs to ``<data dir>/logs/`` (:mod:`trainyard.local.logs`);
once all are up, ``<data dir>/state.json`` tells other commands where the stack
is (:mod:`trainyard.local.state`).

The bus is locked by default: NATS and Redis start with a user per service, per
node agent and per submission portal (:attr:`StackConfig.portals`), passwords kept
in ``<data dir>/bus/`` (:mod:`trainyard.local.credentials`); each process is given
only its own.  ``StackConfig(nats_cluster=3)`` runs NATS as a cluster of three
nodes keeping three replicas of everything (:mod:`trainyard.local.nats_nodes`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from trainyard.local.agents import agent_command, agent_env, agent_nodes, agent_process, is_agent
from trainyard.local.credentials import (
    ADMIN,
    BUS_DIR,
    Credentials,
    ensure_credentials,
    save_credentials,
    service_env,
    write_server_files,
)
from trainyard.local.lock import (
    PORT_NAMES,
    Child,
    StackLock,
    choose_ports,
    listening,
    process_cmdline,
    stop_leftovers,
    stop_processes,
)
from trainyard.local.logs import log_path, log_size, log_tail, logged_ready
from trainyard.local.nats_nodes import check_nats, declare_streams, port_names, replicas_for, start_stack_nats, sync_for
from trainyard.local.servers import Server, ServerError, start_redis
from trainyard.local.state import StackState, private_data_dir, read_state, state_path, write_state

__all__ = ["METRICS_SERVICES", "SERVICES", "LocalStack", "StackConfig", "StackState", "read_state", "state_path"]

#: Process name -> the command after ``python``.
SERVICES: dict[str, list[str]] = {
    "admission": ["-m", "trainyard_admission"],
    "placement": ["-m", "trainyard_placement"],
    "health": ["-m", "trainyard_health"],
    "accounting": ["-m", "trainyard_accounting"],
    "gateway": ["-m", "trainyard_gateway"],
    "emulator": ["-m", "trainyard.cli.main", "emulate", "run"],
}
#: The services that serve Prometheus metrics on a port of their own, one each (the
#: gateway serves ``/metrics`` on its REST port; the emulator serves none).
METRICS_SERVICES = ("admission", "placement", "health", "accounting")
_CREDENTIAL_SETTINGS = (
    "TRAINYARD_NATS_USER",
    "TRAINYARD_NATS_PASSWORD",
    "TRAINYARD_REDIS_USER",
    "TRAINYARD_REDIS_PASSWORD",
)
STOP_TIMEOUT_S = 15.0


class StackConfig(msgspec.Struct):
    data_dir: str = ".trainyard"
    nats_port: int = 0  # 0: the port kept from the last start, else a free one
    redis_port: int = 0
    http_port: int = 0
    grpc_port: int = 0
    nodes: int = 16  # emulated nodes (0: no emulator)
    gpus_per_node: int = 8
    agents: int = 0  # node agents that run jobs' processes for real, each a node of its own
    agent_gpus: int = 8  # fake GPUs per agent (0: the machine's own, through NVML)
    racks: int = 2
    cluster: str = "local"
    heartbeat_interval_s: float = 1.0
    heartbeat_timeout_s: float = 5.0
    log_level: str = "INFO"
    ledger_url: str = ""  # "" is sqlite at <data dir>/ledger.db
    locked_bus: bool = True  # NATS and Redis users with least privilege (docs/security.md)
    portals: list[str] = []  # tenants that get a submission portal's NATS user
    nats_cluster: int = 1  # NATS nodes: 1, or a cluster of 3 (or 5) with 3 replicas of every stream
    nats_sync: str = ""  # JetStream sync_interval: always, default or a duration; "": always on 1 node, else default


class LocalStack:
    def __init__(self, config: StackConfig, progress: Callable[[str], None] | None = None) -> None:
        self.config = config
        self.data_dir = Path(config.data_dir).resolve()
        check_nats(config.nats_cluster, config.nats_sync)
        self.nats: Server | None = None  # the first (or only) NATS node
        self.nats_nodes: list[Server] = []  # every NATS node
        self.redis: Server | None = None
        self.procs: dict[str, subprocess.Popen] = {}
        self.env: dict[str, str] = {}
        self.credentials: Credentials | None = None  # on a locked bus
        self.http_port = config.http_port
        self.grpc_port = config.grpc_port
        self.metrics_ports: dict[str, int] = {}  # service -> its metrics port, chosen by claim()
        self.lock = StackLock(self.data_dir)
        self.progress = progress or (lambda line: None)  # told each process as it starts and is ready
        self.stopping = threading.Event()  # set by request_stop(); start() gives up at the next step
        self.admin_token_created = False  # whether this start made <data_dir>/admin-token (else it was kept)

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def nats_url(self) -> str:
        """Every NATS node's URL, comma-separated, without credentials."""
        return ",".join(node.url for node in self.nats_nodes)

    @property
    def nats_admin_url(self) -> str:
        """:attr:`nats_url` with the admin credential on a locked bus."""
        return ",".join(node.admin_url for node in self.nats_nodes)

    @property
    def nats_replicas(self) -> int:
        return replicas_for(self.config.nats_cluster)

    @property
    def nats_sync(self) -> str:
        return sync_for(self.config.nats_cluster, self.config.nats_sync)

    @property
    def ledger_url(self) -> str:
        return self.config.ledger_url or f"sqlite:///{self.data_dir / 'ledger.db'}"

    @property
    def admin_token(self) -> str | None:
        """The stack's admin API token (``<data_dir>/admin-token``), once the servers are up."""
        from trainyard.auth.bootstrap import read_admin_token

        return read_admin_token(self.data_dir)

    def admin_headers(self) -> dict[str, str]:
        """HTTP headers that call the gateway as the stack's admin."""
        return {"Authorization": f"Bearer {self.admin_token}"}

    def request_stop(self) -> None:
        """Ask a starting or running stack to stop (safe from a signal handler)."""
        self.stopping.set()

    def claim(self) -> None:
        """Take the data directory's lock (raises ``StackRunning`` naming the
        stack that holds it) and choose the ports (raises ``PortError``).
        The data directory is made private first (0700, files 0600, umask 0077)."""
        private_data_dir(self.data_dir)
        stale = self.lock.acquire()
        if stale is not None and stale.pid != os.getpid():
            stopped = stop_leftovers(stale)
            left = f"; stopped its leftover processes: {', '.join(stopped)}" if stopped else ""
            self.progress(f"took over the lock of a stack that is gone (pid {stale.pid} on {stale.host}){left}")
        asked = {
            "http": self.config.http_port,
            "grpc": self.config.grpc_port,
            "nats": self.config.nats_port,
            "redis": self.config.redis_port,
        }
        metrics = [f"{name}-metrics" for name in METRICS_SERVICES]
        names = [*PORT_NAMES, *port_names(self.config.nats_cluster), *metrics]
        ports, notes = choose_ports(self.data_dir, asked, names)
        for note in notes:
            self.progress(note)
        self.ports = ports
        self.http_port, self.grpc_port = ports["http"], ports["grpc"]
        self.metrics_ports = {name: ports[f"{name}-metrics"] for name in METRICS_SERVICES}
        self.lock.update(ports=ports)

    def start_servers(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if not self.lock.held:
            self.claim()
        nats_conf = acl = None
        nats_admin = redis_admin = None
        if self.config.locked_bus:
            bus_dir = self.data_dir / BUS_DIR
            self.credentials = ensure_credentials(bus_dir, self.config.portals)
            with_agents = self.credentials.with_agents(self.agent_nodes)
            if with_agents != self.credentials:
                save_credentials(bus_dir, with_agents)
                self.credentials = with_agents
            nats_conf, acl = write_server_files(bus_dir, self.credentials, cluster=self.config.cluster)
            nats_admin = self.credentials.nats_user(ADMIN).pair
            redis_admin = self.credentials.redis_user(ADMIN).pair
            self.progress(f"bus users and passwords in {bus_dir}")
        size = self.config.nats_cluster
        what = "nats-server" if size == 1 else f"a cluster of {size} nats-servers"
        self.progress(f"{what} starting on port {self.ports['nats']} (sync_interval {self.nats_sync})")
        self.nats_nodes = start_stack_nats(self.data_dir, size, self.ports, self.nats_sync, nats_conf, nats_admin)
        self.nats = self.nats_nodes[0]
        self.progress(f"{what} ready (pid {', '.join(str(n.proc.pid) for n in self.nats_nodes)})")
        self._record_children()
        declare_streams(self.nats_admin_url, self.nats_replicas)
        if self.stopping.is_set():
            return
        self.progress(f"redis-server starting on port {self.ports['redis']}")
        self.redis = start_redis(self.data_dir / "redis", self.ports["redis"], acl_file=acl, admin=redis_admin)
        self.progress(f"redis-server ready (pid {self.redis.proc.pid})")
        self._record_children()
        self._create_ledger()
        from trainyard.auth import ensure_admin_token_at

        _, self.admin_token_created = ensure_admin_token_at(self.nats_admin_url, self.data_dir, self.nats_replicas)
        self.env = {
            **{k: v for k, v in os.environ.items() if k not in _CREDENTIAL_SETTINGS},  # each service gets its own
            "TRAINYARD_NATS_URL": self.nats_url,
            "TRAINYARD_STREAM_REPLICAS": str(self.nats_replicas),
            "TRAINYARD_REDIS_URL": self.redis.url,
            "TRAINYARD_CLUSTER": self.config.cluster,
            "TRAINYARD_DATA_DIR": str(self.data_dir),
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

    def _create_ledger(self) -> None:
        """Create the ledger's tables before the services start, so accounting
        and the gateway never race to create them in a new SQLite file."""
        from trainyard.ledger import Ledger

        ledger = Ledger(self.ledger_url)
        try:
            ledger.create_schema()
        finally:
            ledger.close()

    @property
    def agent_nodes(self) -> list[str]:
        return agent_nodes(self.config.agents)

    def names(self) -> list[str]:
        """Every process the stack starts: the services (the emulator only with
        emulated nodes) and one ``agent-<node>`` per agent."""
        services = [n for n in SERVICES if n != "emulator" or self.config.nodes > 0]
        return [*services, *(agent_process(node) for node in self.agent_nodes)]

    def command_for(self, name: str) -> list[str]:
        """The command line of process ``name``."""
        if is_agent(name):
            return agent_command(name, self.data_dir, self.config.agents, self.config.racks, self.config.agent_gpus)
        return [sys.executable, *SERVICES[name]]

    def service_env(self, name: str) -> dict[str, str]:
        """The environment of service ``name``: the stack's settings, its own
        metrics port and, on a locked bus, its own users (an agent: its node's NATS user, and no Redis)."""
        if is_agent(name):
            return agent_env(self.env, self.credentials, name)
        env = self.env if self.credentials is None else {**self.env, **service_env(self.credentials, name)}
        if name in self.metrics_ports:
            env = {**env, f"TRAINYARD_{name.upper()}_METRICS_PORT": str(self.metrics_ports[name])}
        return env

    def metrics_urls(self) -> dict[str, str]:
        """Where each service serves its metrics (the gateway's needs an operator token)."""
        urls = {name: f"http://127.0.0.1:{port}/metrics" for name, port in self.metrics_ports.items()}
        return {**urls, "gateway": f"{self.api_url}/metrics"}

    def start_service(self, name: str) -> subprocess.Popen:
        path = log_path(self.data_dir, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "ab") as log:
            proc = subprocess.Popen(
                self.command_for(name),
                env=self.service_env(name),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs[name] = proc
        self._record_children()
        return proc

    def start(self, services: list[str] | None = None, wait: float = 60.0) -> None:
        """Start everything (or ``services``); returns early, with what has
        started still running, when :meth:`request_stop` is called."""
        self.start_servers()
        names = services or self.names()
        offsets: dict[str, int] = {}
        for name in names:
            if self.stopping.is_set():
                return
            offsets[name] = log_size(self.data_dir, name)
            proc = self.start_service(name)
            self.progress(f"{name} starting (pid {proc.pid})")
        self._wait_ready(names, offsets, wait)
        if not self.stopping.is_set():
            self.write_state()

    def _wait_ready(self, names: list[str], offsets: dict[str, int], wait: float) -> None:
        """Report each process as it becomes ready; raise if the gateway does
        not listen within ``wait`` seconds."""
        watch_logs = self.config.log_level.upper() in ("DEBUG", "INFO")
        pending = [n for n in names if n == "gateway" or watch_logs]
        deadline = time.monotonic() + wait
        while pending and not self.stopping.is_set():
            for name in list(pending):
                proc = self.procs[name]
                if proc.poll() is not None:
                    if name == "gateway":
                        raise ServerError(
                            f"gateway exited with status {proc.returncode} while starting:\n{self.log_tail(name, 20)}"
                        )
                    pending.remove(name)
                    self.progress(f"{name} exited with status {proc.returncode} while starting")
                    continue
                if self._ready(name, offsets[name]):
                    pending.remove(name)
                    self.progress(f"{name} ready")
            if pending and time.monotonic() > deadline:
                if "gateway" in pending:
                    raise ServerError(f"gateway did not listen on 127.0.0.1:{self.http_port} within {wait}s")
                self.progress(f"not ready yet after {wait:.0f}s: {', '.join(pending)} (see {self.data_dir / 'logs'})")
                return
            self.stopping.wait(0.1)

    def _ready(self, name: str, offset: int) -> bool:
        if name == "gateway" and not listening(self.http_port):
            return False
        if self.config.log_level.upper() not in ("DEBUG", "INFO"):
            return True
        return logged_ready(self.data_dir, name, offset)

    def _record_children(self) -> None:
        """Note every process in the lock, so a start after a crash can stop them."""
        if not self.lock.held:
            return
        procs = {name: proc.pid for name, proc in self.procs.items() if proc.poll() is None}
        for server in (*self.nats_nodes, self.redis):
            if server is not None and server.proc.poll() is None:
                procs[f"{server.name}-server"] = server.proc.pid
        self.lock.update(children={name: Child(pid, process_cmdline(pid)) for name, pid in procs.items()})

    def write_state(self) -> None:
        assert self.nats and self.redis
        state = StackState(
            api_url=self.api_url,
            grpc_target=f"127.0.0.1:{self.grpc_port}",
            nats_url=self.nats_url,
            redis_url=self.redis.url,
            ledger_url=self.ledger_url,
            pid=os.getpid(),
            locked_bus=self.credentials is not None,
            metrics=self.metrics_urls(),
        )
        write_state(self.data_dir, state)

    def kill(self, name: str) -> None:
        """SIGKILL one service, as a crash would."""
        proc = self.procs[name]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()

    def _stop_procs(self, names: list[str], timeout: float) -> None:
        stop_processes([self.procs[n] for n in names if n in self.procs], timeout)

    def exited(self) -> dict[str, int]:
        return {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}

    def stop(self) -> None:
        """Stop every service, then NATS and Redis; release the data directory."""
        self._stop_procs(list(reversed(list(self.procs))), STOP_TIMEOUT_S)
        for node in self.nats_nodes:
            if node.proc.poll() is None:
                node.proc.terminate()  # together: a cluster's nodes need not wait out each other's shutdown
        for node in self.nats_nodes:
            node.stop()
        if self.redis:
            self.redis.stop()
        if self.lock.held:
            state_path(self.data_dir).unlink(missing_ok=True)
            self.lock.release()

    def log_tail(self, name: str, lines: int = 30) -> str:
        return log_tail(self.data_dir, name, lines)
