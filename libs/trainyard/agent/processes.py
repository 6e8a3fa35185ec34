"""One process of a run on this node: its environment, its start through the
shim (:mod:`trainyard.agent.shim`), its pid file and exit file, whether it is
alive, and signals to its process group.

Each process has a directory ``<state>/runs/<run_id>/rank-<r>/`` holding
``pid`` (``<pid> <start time> <shim pid> <shim start time>``) and, once it
ended, ``exit``.  A pid alone is not an identity: a process is taken for
alive only while ``/proc/<pid>/stat`` shows the same start time (field 22)
and it is not a zombie.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shlex
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

AGENT_DIR = Path(__file__).resolve().parent
SHIM = str(AGENT_DIR / "shim.py")
WORKLOAD = str(AGENT_DIR / "workload.py")

#: The job's PATH: the system's directories, after the agent's own Python's
#: (so ``python`` is the Python the agent runs, with Trainyard installed).
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: How long a shim may take to say whether its process started.
START_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class Exit:
    """How a process ended: an exit code, a signal number, or why it never started."""

    exit_code: int | None = None
    signal: int | None = None
    start_error: str | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def signal_name(self) -> str | None:
        if self.signal is None:
            return None
        try:
            return signal.Signals(self.signal).name
        except ValueError:
            return f"SIG{self.signal}"

    @classmethod
    def parse(cls, text: str) -> Exit:
        kind, _, value = text.strip().partition(" ")
        if kind == "exit":
            return cls(exit_code=int(value))
        if kind == "signal":
            return cls(signal=int(value))
        if kind == "lost":
            return cls()
        return cls(start_error=value or "it could not be started")


@dataclass(frozen=True, slots=True)
class Pids:
    """What a pid file says: the process (its group's leader) and its shim."""

    pid: int
    start: int
    shim_pid: int
    shim_start: int

    @classmethod
    def parse(cls, text: str) -> Pids:
        pid, start, shim_pid, shim_start = (int(x) for x in text.split())
        return cls(pid, start, shim_pid, shim_start)


def start_time(pid: int) -> int | None:
    """Field 22 of ``/proc/<pid>/stat`` (clock ticks after boot); None when there is
    no such process or it is a zombie."""
    fields = _stat(pid)
    return None if fields is None or fields[0] == b"Z" else int(fields[19])


def alive(pid: int, start: int) -> bool:
    return start_time(pid) == start


def group_alive(pgid: int) -> bool:
    """Whether a live process of the process group is left.  Zombies are not
    (they hold nothing; orphans wait for init, which may be slow, to reap them)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stats = (_stat(int(entry)) for entry in os.listdir("/proc") if entry.isdigit())
    return any(s is not None and int(s[2]) == pgid and s[0] != b"Z" for s in stats)


def _stat(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` after the command (field 3 on), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rindex(b")") + 2 :].split()


def signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to a process group; False when the group is gone."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except (FileNotFoundError, NotADirectoryError):
        return None


def read_pids(rank_dir: Path) -> Pids | None:
    text = read_text(rank_dir / "pid")
    try:
        return Pids.parse(text) if text else None
    except ValueError:
        return None


def read_exit(rank_dir: Path) -> Exit | None:
    text = read_text(rank_dir / "exit")
    return Exit.parse(text) if text else None


def write_exit(rank_dir: Path, exit: Exit) -> None:
    """Record an exit the shim could not (it was never started, or the shim is gone)."""
    if exit.start_error is not None:
        text = f"error {exit.start_error}"
    elif exit.signal is not None:
        text = f"signal {exit.signal}"
    elif exit.exit_code is None:
        text = "lost"
    else:
        text = f"exit {exit.exit_code}"
    tmp = rank_dir / "exit.tmp"
    tmp.write_text(text + "\n")
    tmp.replace(rank_dir / "exit")


# --- the environment a process gets ---


def base_environment(run_as: str | None = None) -> dict[str, str]:
    """What every job gets whatever its launch says: PATH, HOME, LANG,
    USER/LOGNAME (of the user it runs as) and TMPDIR when it is not /tmp.
    Built from the password database, never from the agent's environment."""
    entry = pwd.getpwnam(run_as) if run_as else pwd.getpwuid(os.getuid())
    env = {
        "PATH": f"{os.path.dirname(sys.executable)}:{SYSTEM_PATH}",
        "HOME": entry.pw_dir,
        "LANG": "C.UTF-8",
        "USER": entry.pw_name,
        "LOGNAME": entry.pw_name,
    }
    if (tmp := tempfile.gettempdir()) != "/tmp":
        env["TMPDIR"] = tmp
    return env


def workload_argv(env: dict[str, str]) -> list[str]:
    """The built-in simulated workload, its options from the launch's environment."""
    return [
        sys.executable,
        "-I",
        "-S",
        WORKLOAD,
        "--duration",
        env.get("TRAINYARD_SIMULATED_DURATION_S", "5"),
        "--checkpoint-every",
        env.get("TRAINYARD_SIMULATED_CHECKPOINT_S", "0"),
        "--checkpoint-dir",
        env.get("TRAINYARD_CHECKPOINT_DIR", ""),
        "--resume-step",
        env.get("TRAINYARD_RESUME_STEP", "0"),
        "--stop-signal",
        env.get("TRAINYARD_STOP_SIGNAL", "SIGTERM"),
    ]


def container_argv(
    template: str, image: str, gpus: list[int], workdir: str, env: dict[str, str], argv: list[str]
) -> list[str]:
    """The runtime's command for ``argv`` in ``image``: each word of
    ``template`` with ``{image}``, ``{gpus}`` (comma-separated indices, or
    ``none``), ``{workdir}`` filled in, and a word ``{env}`` replaced by
    ``-e NAME`` for every variable of the job (the runtime copies the value
    from its own environment, which is the job's); ``argv`` follows."""
    words: list[str] = []
    for word in shlex.split(template):
        if word == "{env}":
            for name in sorted(env):
                words += ["-e", name]
            continue
        words.append(word.format(image=image, gpus=",".join(map(str, gpus)) or "none", workdir=workdir))
    return words + argv


def start_problem(argv: list[str], env: dict[str, str], cwd: str) -> str | None:
    """Why ``argv`` cannot start in ``cwd`` (said at once, before any process), or None."""
    if not argv or not argv[0]:
        return (
            "the job gives no command, and this node runs no container runtime to start its image's "
            "entrypoint: give the role a command (or run the agent with --container-runtime)"
        )
    if not os.path.isdir(cwd):
        return f"working directory {cwd!r} does not exist or is not a directory"
    if shutil.which(argv[0], path=env.get("PATH", "")) is None:
        where = "" if "/" in argv[0] else f" on PATH {env.get('PATH', '')!r}"
        return f"command {argv[0]!r} not found or not executable{where}"
    return None


async def spawn(
    rank_dir: Path, log_path: Path, argv: list[str], env: dict[str, str], cwd: str, run_as: str | None = None
) -> tuple[asyncio.subprocess.Process | None, Pids | Exit]:
    """Start ``argv`` through the shim.  Returns the shim (this agent's child,
    to be reaped) and the process's pids, or the reason it could not start."""
    if problem := start_problem(argv, env, cwd):
        return None, Exit(start_error=problem)
    user: dict[str, object] = {}
    if run_as:
        entry = pwd.getpwnam(run_as)
        user = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
    try:
        shim = await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",
            "-S",
            SHIM,
            str(rank_dir),
            str(log_path),
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            cwd=cwd,
            env=env,
            start_new_session=True,
            **user,  # type: ignore[arg-type]
        )
    except OSError as err:
        return None, Exit(start_error=f"cannot start {argv[0]!r}: {err}")
    assert shim.stdout is not None
    try:
        line = (await asyncio.wait_for(shim.stdout.readline(), START_TIMEOUT_S)).decode(errors="replace").strip()
    except TimeoutError:
        line = ""
    if line == "started" and (pids := read_pids(rank_dir)) is not None:
        return shim, pids
    return shim, read_exit(rank_dir) or Exit(start_error=f"the shim said {line!r}" if line else "the shim said nothing")
