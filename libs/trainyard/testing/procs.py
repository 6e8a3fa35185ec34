"""What /proc says about the processes of a local stack and of the jobs its
agents run: CPU seconds, resident memory, and which run each live job process
belongs to.  Used by ``bench/launch.py`` and the real-process chaos run."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
SHIM = "trainyard/agent/shim.py"  # the agent's shim: the job's environment, but no GPU work


class CpuSample(msgspec.Struct, frozen=True):
    own_s: float  # user + system CPU seconds of the process itself
    children_s: float  # ... of its children it has reaped (the agent's shims and their commands)


def _stat_fields(pid: int) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name (field 3 is index 0)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu(pid: int) -> CpuSample:
    """CPU seconds of ``pid`` so far; raises OSError when it is gone."""
    f = _stat_fields(pid)
    return CpuSample(own_s=(int(f[11]) + int(f[12])) / CLOCK_TICKS, children_s=(int(f[13]) + int(f[14])) / CLOCK_TICKS)


def rss_mib(pid: int) -> float | None:
    """Resident memory of ``pid`` in MiB; None when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def boot_epoch() -> float:
    """When this machine booted, in Unix time, to about 10 ms (from /proc/uptime,
    finer than /proc/stat's btime, which is whole seconds)."""
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return time.time() - uptime


def started_at(start_ticks: int, booted: float) -> float:
    """Unix time of a process start given as /proc/<pid>/stat field 22."""
    return booted + start_ticks / CLOCK_TICKS


class JobProcess(msgspec.Struct, frozen=True):
    """A live process that runs part of a job (not the agent's shim)."""

    pid: int
    job_id: str
    run_id: str
    node_id: str  # from the agent's directory in its checkpoint dir or working dir; "" when unknown
    gpus: tuple[int, ...]  # CUDA_VISIBLE_DEVICES


def _environ(pid: int) -> dict[str, str] | None:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key.startswith((b"TRAINYARD_", b"CUDA_VISIBLE_DEVICES")):
            out[key.decode()] = value.decode(errors="replace")
    return out


def _is_live_command(pid: int) -> bool:
    """Neither a zombie nor the agent's shim."""
    try:
        if _stat_fields(pid)[0] == "Z":
            return False
        return SHIM not in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def node_of(path: str, agents_dir: str) -> str:
    """The node whose agent state directory (``<agents_dir>/<node>/...``) holds ``path``."""
    prefix = agents_dir.rstrip("/") + "/"
    return path[len(prefix) :].split("/", 1)[0] if path.startswith(prefix) else ""


def job_processes(agents_dir: str) -> Iterator[JobProcess]:
    """Every live job process of this machine whose agent keeps its state
    under ``agents_dir`` (by its checkpoint or working directory)."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        env = _environ(pid)
        if not env or "TRAINYARD_RUN_ID" not in env:
            continue
        node = node_of(env.get("TRAINYARD_CHECKPOINT_DIR", ""), agents_dir)
        if not node:
            try:
                node = node_of(os.readlink(f"/proc/{pid}/cwd"), agents_dir)
            except OSError:
                continue
        if not node or not _is_live_command(pid):
            continue
        visible = env.get("CUDA_VISIBLE_DEVICES", "")
        gpus = tuple(int(g) for g in visible.split(",") if g.strip().isdigit())
        yield JobProcess(pid, env.get("TRAINYARD_JOB_ID", ""), env["TRAINYARD_RUN_ID"], node, gpus)
