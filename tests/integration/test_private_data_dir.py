"""The data directory of ``trainyard up`` is private to its owner: made 0700,
an existing one stripped of every group and other bit (folders 0700, files
0600), and what the servers write afterwards (Redis's append-only file, logs,
the ledger, the ACL file) private too, through the umask they inherit."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from trainyard.local.credentials import new_credentials, write_server_files
from trainyard.local.state import private_data_dir


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_an_existing_world_readable_data_directory_is_made_private(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "logs").mkdir(parents=True)
    (data / "ledger.db").write_text("usage")
    (data / "logs" / "gateway.log").write_text("lines")
    (data / "run.sh").write_text("#!/bin/sh\n")
    for path, bits in [(data, 0o755), (data / "logs", 0o775), (data / "ledger.db", 0o644), (data / "run.sh", 0o755)]:
        os.chmod(path, bits)
    (data / "elsewhere").symlink_to(tmp_path)  # a link is not followed, nor is its target changed
    os.chmod(tmp_path, 0o755)
    before = os.umask(0o022)
    try:
        changed = private_data_dir(data)
        assert os.umask(0o022) == 0o077
    finally:
        os.umask(before)

    assert (mode(data), mode(data / "logs"), mode(data / "ledger.db")) == (0o700, 0o700, 0o600)
    assert (mode(data / "logs" / "gateway.log"), mode(data / "run.sh")) == (0o600, 0o700)
    assert mode(tmp_path) == 0o755 and data / "elsewhere" not in changed
    assert private_data_dir(data) == []  # nothing left to change


def test_what_the_servers_write_after_it_is_private(tmp_path: Path) -> None:
    """A fresh process (as ``trainyard up`` is) makes the directory private,
    then starts Redis and writes the ACL file: the append-only file, Redis's
    log and the ACL file are the owner's alone."""
    data = tmp_path / "data"
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from trainyard.local.state import private_data_dir\n"
        "from trainyard.local.servers import start_redis\n"
        "from trainyard.local.credentials import new_credentials, write_server_files\n"
        "data = Path(sys.argv[1])\n"
        "private_data_dir(data)\n"
        "(data / 'bus').mkdir()\n"
        "write_server_files(data / 'bus', new_credentials())\n"
        "server = start_redis(data / 'redis')\n"
        "import redis\n"
        "client = redis.Redis.from_url(server.url)\n"
        "client.set('ty:job:j1', 'spec')\n"
        "client.execute_command('BGREWRITEAOF')\n"
        "client.close()\n"
        "server.stop()\n"
    )
    subprocess.run([sys.executable, "-c", script, str(data)], check=True, timeout=60)

    written = [p for p in data.rglob("*") if not p.is_symlink()]
    assert any("appendonly" in p.name for p in written)
    assert [(str(p.relative_to(data)), oct(mode(p))) for p in written if mode(p) & 0o077] == []


def test_the_local_acl_file_is_private_and_the_deploy_one_readable_by_composes_redis_user(tmp_path: Path) -> None:
    (tmp_path / "local").mkdir()
    (tmp_path / "deploy").mkdir()

    _, local = write_server_files(tmp_path / "local", new_credentials())
    _, deploy = write_server_files(tmp_path / "deploy", new_credentials(), acl_mode=0o644)

    assert (mode(local), mode(deploy)) == (0o600, 0o644)
