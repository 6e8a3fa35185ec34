"""The pieces of a process start that need no process: the container
command, the base environment, exit records, start problems."""

from __future__ import annotations

import getpass
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainyard.agent.processes import SHIM, Exit, base_environment, container_argv, read_exit, start_problem, write_exit


def test_the_container_template_gets_the_image_gpus_workdir_and_the_jobs_variable_names() -> None:
    template = "docker run --rm --gpus device={gpus} -v {workdir}:{workdir} -w {workdir} {env} {image}"
    argv = container_argv(template, "pytorch:24.05", [2, 3], "/w/r1", {"RANK": "0", "A": "secret"}, ["python", "t.py"])
    assert argv == [
        "docker", "run", "--rm", "--gpus", "device=2,3", "-v", "/w/r1:/w/r1", "-w", "/w/r1",
        "-e", "A", "-e", "RANK", "pytorch:24.05", "python", "t.py",
    ]  # fmt: skip
    assert "secret" not in argv, "values travel in the runtime's environment, not on its command line"


def test_an_unknown_placeholder_is_an_error() -> None:
    with pytest.raises(KeyError):
        container_argv("podman run {imag}", "i", [], "/w", {}, [])


def test_the_base_environment_is_the_users_not_the_agents() -> None:
    env = base_environment()
    assert env["USER"] == env["LOGNAME"] == getpass.getuser()
    assert set(env) <= {"PATH", "HOME", "LANG", "USER", "LOGNAME", "TMPDIR"}


@pytest.mark.parametrize(
    "exit",
    [Exit(exit_code=0), Exit(exit_code=3), Exit(signal=9), Exit(start_error="cannot start 'x': gone"), Exit()],
    ids=["exit 0", "exit 3", "SIGKILL", "a start error", "lost"],
)
def test_exit_records_read_back_as_written(tmp_path: Path, exit: Exit) -> None:
    write_exit(tmp_path, exit)
    assert read_exit(tmp_path) == exit


@pytest.mark.parametrize(
    ("argv", "cwd", "problem"),
    [
        pytest.param([], "/", "gives no command", id="no command and no container runtime for the image"),
        pytest.param(["sh"], "/no/such/dir", "working directory '/no/such/dir' does not exist", id="no directory"),
        pytest.param(["/bin/no-such"], "/", "command '/bin/no-such' not found", id="no such file"),
        pytest.param(["sh"], "/", None, id="found on PATH"),
    ],
)
def test_start_problems_are_named(argv: list[str], cwd: str, problem: str | None) -> None:
    found = start_problem(argv, {"PATH": "/usr/bin:/bin"}, cwd)
    assert found == problem if problem is None else problem in (found or "")


@pytest.mark.parametrize(
    ("argv", "recorded"),
    [
        pytest.param(["sh", "-c", "sleep 0.2; exit 4"], "exit 4", id="a process that starts"),
        pytest.param(["/bin/no-such"], "error cannot start", id="a process that cannot start"),
    ],
)
def test_the_shim_records_the_exit_when_the_agent_that_started_it_is_gone(
    tmp_path: Path, argv: list[str], recorded: str
) -> None:
    """An agent killed while a process starts: the shim's word to it hits a
    broken pipe, and the shim still waits for its process and writes the exit."""
    readable, writable = os.pipe()
    os.close(readable)  # the agent is gone before the shim says "started"
    try:
        shim = subprocess.run(
            [sys.executable, "-I", "-S", SHIM, str(tmp_path), str(tmp_path / "rank.log"), *argv],
            stdout=writable,
            stderr=subprocess.PIPE,
            timeout=60,
        )
    finally:
        os.close(writable)
    assert shim.returncode == 0, shim.stderr.decode()
    assert (tmp_path / "exit").read_text().startswith(recorded)
