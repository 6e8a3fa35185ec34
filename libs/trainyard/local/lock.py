"""One stack per data directory, and ports that stay put across restarts.

``<data dir>/stack.lock`` holds an exclusive ``flock`` for as long as a stack
runs, and says who holds it: pid, host, ports and the pids of its processes.
The kernel drops the ``flock`` when its holder dies, so a lock left behind by
a crash is taken over by the next start, which also stops whatever processes
the dead stack left running.

``<data dir>/ports.json`` keeps the ports a stack chose, so the next start
listens where clients (and a portal's configuration) expect it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import msgspec

from trainyard.local.servers import free_port

LOCK_FILE = "stack.lock"
PORTS_FILE = "ports.json"
#: The ports a stack listens on, in the order they are chosen.
PORT_NAMES = ("http", "grpc", "nats", "redis")


class Child(msgspec.Struct):
    pid: int
    cmdline: str  # the process's first arguments, to recognise it before stopping it


class LockInfo(msgspec.Struct):
    """What ``stack.lock`` says about the stack holding it."""

    pid: int
    host: str
    started_at: float = 0.0
    ports: dict[str, int] = {}
    children: dict[str, Child] = {}  # process name -> the process


class StackRunning(Exception):
    """Another stack holds the data directory."""

    def __init__(self, data_dir: Path, info: LockInfo | None) -> None:
        self.info = info
        if info is None:
            who = "a stack is starting"
        else:
            ports = ", ".join(f"{name} {port}" for name, port in info.ports.items()) or "ports not chosen yet"
            who = f"a stack is already running (pid {info.pid} on {info.host}; {ports})"
        super().__init__(f"{who} from {data_dir}; stop it first (Ctrl-C, or kill it) or use another --data-dir")


class PortError(Exception):
    """A port the user asked for cannot be used."""


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def process_cmdline(pid: int, args: int = 4) -> str:
    """The first ``args`` arguments of a running process ("" when it is gone)."""
    return " ".join(_cmdline(pid).split(" ")[:args])


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class StackLock:
    """The exclusive lock on one data directory."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / LOCK_FILE
        self.fd: int | None = None
        self.info: LockInfo | None = None

    @property
    def held(self) -> bool:
        return self.fd is not None

    def acquire(self) -> LockInfo | None:
        """Take the lock; returns what a dead holder left behind (None if nothing).
        Raises :class:`StackRunning` naming the holder when it is alive."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            os.close(fd)
            if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            raise StackRunning(self.path.parent, self._read()) from None
        self.fd = fd
        stale = self._read()
        self.info = LockInfo(pid=os.getpid(), host=socket.gethostname(), started_at=time.time())
        self._write()
        return stale

    def update(self, ports: dict[str, int] | None = None, children: dict[str, Child] | None = None) -> None:
        if self.info is None:
            return
        if ports is not None:
            self.info.ports = dict(ports)
        if children is not None:
            self.info.children = dict(children)
        self._write()

    def release(self) -> None:
        if self.fd is None:
            return
        os.ftruncate(self.fd, 0)
        os.close(self.fd)  # closing drops the flock
        self.fd = None
        self.info = None

    def _read(self) -> LockInfo | None:
        try:
            raw = self.path.read_bytes()
            return msgspec.json.decode(raw, type=LockInfo) if raw.strip() else None
        except (OSError, msgspec.DecodeError):
            return None

    def _write(self) -> None:
        assert self.fd is not None and self.info is not None
        data = msgspec.json.format(msgspec.json.encode(self.info)) + b"\n"
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)


def stop_leftovers(stale: LockInfo, timeout: float = 10.0) -> list[str]:
    """Stop the processes a crashed stack left running (those still running
    the command it recorded, so a reused pid is never touched).  Returns
    their names."""
    found = {
        name: child
        for name, child in stale.children.items()
        if stale.host == socket.gethostname() and child.cmdline and process_cmdline(child.pid) == child.cmdline
    }
    for child in found.values():
        signal_group(child.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while any(pid_alive(c.pid) for c in found.values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    for child in found.values():
        if process_cmdline(child.pid) == child.cmdline:
            signal_group(child.pid, signal.SIGKILL)
    return sorted(found)


def signal_group(pid: int, sig: int) -> None:
    """Signal a process started in its own session, and anything it started."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def stop_processes(procs: list[subprocess.Popen], timeout: float) -> None:  # type: ignore[type-arg]
    """SIGTERM each process (with whatever it started) together, then SIGKILL
    any still running after ``timeout``."""
    running = [proc for proc in procs if proc.poll() is None]
    for proc in running:
        signal_group(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc in running:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            signal_group(proc.pid, signal.SIGKILL)
            proc.wait()


# --- ports ---------------------------------------------------------------------------------------------


def listening(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:``port``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def port_free(port: int) -> bool:
    """Whether nothing listens on 127.0.0.1:``port`` (a closed socket still in
    TIME_WAIT does not count: the servers bind with SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def read_ports(data_dir: Path) -> dict[str, int]:
    try:
        return msgspec.json.decode((data_dir / PORTS_FILE).read_bytes(), type=dict[str, int])
    except (OSError, msgspec.DecodeError):
        return {}


def write_ports(data_dir: Path, ports: dict[str, int]) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    tmp = data_dir / f".{PORTS_FILE}.tmp"
    tmp.write_bytes(msgspec.json.format(msgspec.json.encode(ports)) + b"\n")
    tmp.replace(data_dir / PORTS_FILE)


def choose_ports(
    data_dir: Path, asked: dict[str, int], names: Sequence[str] = PORT_NAMES
) -> tuple[dict[str, int], list[str]]:
    """The port of each of ``names`` (:data:`PORT_NAMES`, and a NATS cluster's
    other ports): the one asked for (non-zero in
    ``asked``), else the one kept from the last start, else a free one; and a
    note for each kept port another program has taken since.  Stores the
    result.  Raises :class:`PortError` when a port asked for is in use."""
    stored = read_ports(data_dir)
    chosen: dict[str, int] = {}
    notes: list[str] = []

    def fresh() -> int:
        while True:
            port = free_port()
            if port not in chosen.values():
                return port

    for name in names:
        port = asked.get(name) or 0
        if port:
            if not port_free(port) or port in chosen.values():
                raise PortError(
                    f"--{name}-port {port} is in use by another program; choose another port or leave the option "
                    "out to use the one kept from the last start"
                )
        elif stored.get(name):
            port = stored[name]
            if not port_free(port) or port in chosen.values():
                replacement = fresh()
                notes.append(
                    f"{name} port {port} (kept from the last start) is now in use by another program; "
                    f"using {replacement} instead"
                )
                port = replacement
        else:
            port = fresh()
        chosen[name] = port
    write_ports(data_dir, chosen)
    return chosen, notes
