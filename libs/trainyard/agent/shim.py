"""The shim every process of a run is started through (``python -I -S shim.py``).

    shim.py <rank-dir> <log-file> <argv...>

It starts ``argv`` (looked up on its own ``PATH``: the shim runs in the
job's environment, which the job inherits) in a session and process group of
its own, with stdout and stderr appended to the log file and every signal at
its default, then records, atomically:

- ``<rank-dir>/pid``: ``<pid> <start time> <shim pid> <shim start time>``
  (start times from ``/proc/<pid>/stat`` field 22, so a reused pid is told apart);
- ``<rank-dir>/exit``: ``exit <code>``, ``signal <number>`` or ``error <why>``
  (the command could not be started).

It tells its parent (the agent) ``started`` or ``error ...`` on stdout; when
the agent is gone (killed while the process was being started) it goes on
without telling.  The shim sits outside the job's process group and ignores
the stop signals, so a signal to the group, SIGKILL included, never loses the
exit status; it outlives an agent restart, and the agent reads the files when
it comes back.
Standard library only: it starts in milliseconds.
"""

from __future__ import annotations

# The C module under ``signal``: importing ``signal`` itself (enum, functools,
# collections) would triple the shim's start time.
import _signal as signal
import os
import sys

IGNORED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def start_time(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return int(stat[stat.rindex(b")") + 2 :].split()[19])


def record(rank_dir: str, name: str, text: str) -> None:
    path = os.path.join(rank_dir, name)
    with open(f"{path}.tmp", "w") as f:
        f.write(text + "\n")
    os.replace(f"{path}.tmp", path)


def spawn(argv: list[str], log: int) -> int:
    """Start ``argv`` in a new session with the log as stdout and stderr and
    the signals this shim ignores back at their defaults; its pid.  Raises
    OSError when it cannot be executed (a close-on-exec pipe says so)."""
    readable, writable = os.pipe()  # both close on exec
    pid = os.fork()
    if pid == 0:
        try:
            os.close(readable)
            os.setsid()
            os.dup2(log, 1)
            os.dup2(log, 2)
            for sig in (*IGNORED, signal.SIGPIPE, signal.SIGXFSZ):
                signal.signal(sig, signal.SIG_DFL)
            os.execvp(argv[0], argv)
        except OSError as err:
            os.write(writable, (err.strerror or str(err)).encode())
        finally:
            os._exit(127)
    os.close(writable)
    with os.fdopen(readable, "rb") as pipe:
        failed = pipe.read()
    if failed:
        os.waitpid(pid, 0)
        raise OSError(failed.decode(errors="replace"))
    return pid


def tell(text: str) -> None:
    """Say ``text`` to the agent; an agent that is gone (a broken pipe) hears
    nothing, and the shim goes on: the exit status must still be recorded."""
    try:
        os.write(1, text.encode())
    except OSError:
        pass


def main(rank_dir: str, log_path: str, argv: list[str]) -> int:
    for sig in IGNORED:
        signal.signal(sig, signal.SIG_IGN)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
    try:
        pid = spawn(argv, log)
    except OSError as err:
        why = f"cannot start {argv[0]!r}: {err}"
        os.write(log, f"trainyard: {why}\n".encode())
        record(rank_dir, "exit", f"error {why}")
        tell(f"error {why}\n")
        return 0
    record(rank_dir, "pid", f"{pid} {start_time(pid)} {os.getpid()} {start_time(os.getpid())}")
    tell("started\n")
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)  # the agent may be gone: nothing more is said on the pipe
    os.close(log)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    record(rank_dir, "exit", f"signal {-code}" if code < 0 else f"exit {code}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3:]))
