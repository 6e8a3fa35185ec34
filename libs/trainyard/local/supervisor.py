"""Keep every process of a local stack running: the services, nats-server
and Redis.

A process that exits is started again after a backoff that doubles with each
exit in a row (1 s, 2 s, 4 s ... at most 30 s) and resets once the process has
stayed up for a healthy period (60 s).  Each process has its own backoff: one
process waiting to restart holds none of the others back.  nats-server and
Redis restart with the same command line, data directory and port; each node
of a NATS cluster (``nats-1``, ``nats-2``, ...) is a process of its own, and
rejoins the cluster when it restarts.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from trainyard.local.servers import Server, wait_port


def servers(stack) -> dict[str, Server]:  # type: ignore[no-untyped-def]
    """The stack's servers by name: ``nats`` (or each node of a NATS
    cluster, ``nats-1``...) and ``redis``."""
    nodes = list(getattr(stack, "nats_nodes", None) or ([stack.nats] if stack.nats is not None else []))
    found = {node.name: node for node in nodes}
    if stack.redis is not None:
        found["redis"] = stack.redis
    return found


@dataclass
class Backoff:
    """When a process that keeps exiting may start again."""

    first_s: float = 1.0
    max_s: float = 30.0
    healthy_s: float = 60.0  # up this long and the next exit counts as the first
    exits: int = 0  # exits in a row
    started_at: float = field(default=float("-inf"))

    def started(self, now: float) -> None:
        self.started_at = now

    def exited(self, now: float) -> float:
        """Record an exit at ``now``; returns how long to wait before the restart."""
        if now - self.started_at >= self.healthy_s:
            self.exits = 0
        self.exits += 1
        return min(self.first_s * 2 ** (self.exits - 1), self.max_s)


def restart_server(server: Server, timeout: float = 30.0) -> None:
    """Start a stopped or dead nats-server / Redis again, as it was started."""
    if server.proc.poll() is None:
        server.kill()
    with open(server.log_path, "ab") as log:
        server.proc = subprocess.Popen(server.proc.args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    wait_port(server.port, timeout=timeout, proc=server.proc, name=server.name)


class Supervisor:
    """Watches a :class:`~trainyard.local.stack.LocalStack` (duck-typed: its
    ``procs``, ``nats`` or ``nats_nodes``, ``redis`` and ``start_service``)."""

    def __init__(
        self,
        stack,
        say: Callable[[str], None] = lambda line: None,  # type: ignore[no-untyped-def]
        clock: Callable[[], float] = time.monotonic,
        backoff: Callable[[], Backoff] = Backoff,
    ) -> None:
        self.stack = stack
        self.say = say
        self.clock = clock
        self.backoffs: dict[str, Backoff] = {}
        self.due: dict[str, float] = {}  # process -> when it restarts
        self.restarts: dict[str, int] = {}
        self._new_backoff = backoff
        now = clock()
        for name in self.names():
            self._backoff(name).started(now)

    def names(self) -> list[str]:
        return [*self.stack.procs, *servers(self.stack)]

    def _backoff(self, name: str) -> Backoff:
        return self.backoffs.setdefault(name, self._new_backoff())

    def _exit_code(self, name: str) -> int | None:
        found = servers(self.stack)
        proc = found[name].proc if name in found else self.stack.procs[name]
        return proc.poll()

    def check(self) -> None:
        """One pass: notice exits, restart whatever is due."""
        now = self.clock()
        for name in self.names():
            if name in self.due:
                if now >= self.due[name]:
                    self._restart(name)
                continue
            code = self._exit_code(name)
            if code is not None:
                wait = self._backoff(name).exited(now)
                self.due[name] = now + wait
                self.say(f"{name} exited with status {code}; restarting in {wait:.0f}s")

    def _restart(self, name: str) -> None:
        del self.due[name]
        try:
            found = servers(self.stack)
            if name in found:
                restart_server(found[name])
            else:
                self.stack.start_service(name)
        except Exception as err:  # noqa: BLE001 - tried again after the next backoff
            self.say(f"{name} did not start again: {err}")
            return
        self._backoff(name).started(self.clock())
        self.restarts[name] = self.restarts.get(name, 0) + 1
        self.say(f"{name} restarted")

    def run(self, stopping: threading.Event, interval_s: float = 0.5) -> None:
        """Check every ``interval_s`` until ``stopping`` is set."""
        while not stopping.wait(interval_s):
            self.check()
