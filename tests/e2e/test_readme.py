"""The README, followed top to bottom: every shell block marked
``<!-- run in order by tests/e2e/test_readme.py -->`` is run command by command,
in the README's order, with the ``trainyard`` command against a real stack of 4
node agents x 8 fake GPUs (what ``make up`` starts), from a folder holding the
repository's ``examples/``.  ``<job-id>`` is the id the last ``submit`` printed,
as the README says.  Each command must exit 0 and print what the README says it
shows (:data:`EXPECTED`); a command that reads state that is still changing (a
job's logs while it runs) is run again until it does, within a deadline."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from execution_fixtures import agent_stack

from trainyard.local import LocalStack

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MARK = "<!-- run in order by tests/e2e/test_readme.py -->"
PLACEHOLDER = "<job-id>"


@dataclass(frozen=True)
class Expect:
    shows: str  # a regular expression the output (stdout and stderr) must match
    again: bool = False  # reads state that is still changing: run again until it shows it


JOB_ID = r"(?m)^[0-9a-z][0-9a-z._-]*$"
#: every command of the marked blocks, as the README writes it -> what it must show
EXPECTED: dict[str, Expect] = {
    "trainyard submit --tenant acme --gpus 2 -- python3 -c \"import os; print('rank', os.environ['RANK'], "
    "'of', os.environ['WORLD_SIZE'])\"": Expect(JOB_ID),
    "trainyard logs <job-id>": Expect(r"rank 0 of 2", again=True),
    "trainyard submit -f examples/distributed/allreduce-job.yaml": Expect(JOB_ID),
    "trainyard logs <job-id> --follow": Expect(r"step 39: all-reduce sum=\d+ ok"),
    "trainyard submit --tenant acme --gpus 8 --replicas 2 --duration 30": Expect(JOB_ID),
    "trainyard submit -f examples/rl-job.yaml": Expect(JOB_ID),
    "trainyard jobs": Expect(r"grpo-llama-8b"),
    "trainyard jobs | grep running": Expect(r"running", again=True),
    "trainyard jobs --all -o name": Expect(JOB_ID),
    "trainyard job <job-id>": Expect(r"grpo-llama-8b"),
    "trainyard nodes": Expect(r"(?s)a00\s+healthy\s+H100\s+8.*a01\s+healthy.*a02\s+healthy.*a03\s+healthy"),
    "trainyard cancel <job-id>": Expect(r"cancel requested for "),
    "trainyard usage": Expect(r"acme", again=True),
    "trainyard why <job-id>": Expect(r"is not waiting: it is cancel"),
    "trainyard events schema": Expect(r'"\$comment": "Publish to trainyard\.intake\.<tenant>'),
    "trainyard config validate examples/tenancy.yaml": Expect(
        r"(?s)examples/tenancy\.yaml: valid \(2 organisations, 9 queues\).*"
        r"warning: the running fleet has no A100, H200 GPUs \(it has H100 on 4 node\(s\)\)"
    ),
    "trainyard config diff examples/tenancy.yaml": Expect(r"no tenancy configuration is in force"),
    'trainyard config apply examples/tenancy.yaml --reason "Q4 quotas"': Expect(
        r"(?s)applied as revision 1.*warning: the running fleet has no A100, H200 GPUs"
    ),
    "trainyard submit --tenant llm --queue pretrain --gpus 8 --replicas 4 --priority-class standard": Expect(JOB_ID),
    "trainyard auth token create --name alice --role researcher --tenant acme": Expect(
        r"(?s)^ty_\S+\n.*created token \S+ \(alice: researcher, tenant acme\)"
    ),
    "trainyard dlq list": Expect(r"no dead letters"),
    "trainyard export chargeback --period this-month --format csv": Expect(r"acme|wrote \S+\.csv: [1-9]\d* rows"),
    "trainyard report capacity --period this-month --out report/": Expect(r"report"),
    "trainyard sim compare --workload synthetic --jobs 2000 --nodes 64 --failures --policies trainyard,fifo,slurm": Expect(
        r"(?s)│ trainyard .*│ fifo .*│ slurm .*slurm: finished 2,000 jobs"
    ),
    "trainyard sim compare --workload philly --policies trainyard,fifo --limit 2000": Expect(
        r"(?s)trainyard: finished 2,000 jobs.*fifo: finished 2,000 jobs"
    ),
}


def marked_commands(text: str) -> list[str]:
    """The commands of the marked ``sh`` blocks in order, one a line, comments dropped."""
    lines = text.splitlines()
    commands: list[str] = []
    for i, line in enumerate(lines):
        if line.strip() != MARK:
            continue
        assert lines[i + 1].startswith("```sh"), f"README line {i + 2}: {MARK} must be followed by a ```sh block"
        j = i + 2
        while lines[j].strip() != "```":
            command = drop_comment(lines[j]).strip()
            if command:
                commands.append(command)
            j += 1
    return commands


def drop_comment(line: str) -> str:
    """``line`` up to a ``#`` that starts a shell comment (after a space, outside quotes)."""
    quote = ""
    for i, char in enumerate(line):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def test_the_marked_blocks_are_read_as_the_readme_writes_them() -> None:
    text = """
<!-- run in order by tests/e2e/test_readme.py -->
```sh
trainyard submit -- python3 -c "print('#1')"   # runs # once
trainyard logs <job-id>

```

```sh
trainyard not-marked
```
"""
    assert marked_commands(text) == ["trainyard submit -- python3 -c \"print('#1')\"", "trainyard logs <job-id>"]


def test_every_command_the_readme_runs_has_what_it_shows_written_down() -> None:
    """Adding a command to a marked block, or changing one, means saying in EXPECTED what it shows."""
    unsaid = [command for command in marked_commands(README.read_text()) if command not in EXPECTED]
    assert unsaid == [], "add these README commands to EXPECTED in tests/e2e/test_readme.py with what they show"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    with agent_stack(tmp_path_factory.mktemp("readme"), agents=4, agent_gpus=8, heartbeat_timeout_s=15.0) as s:
        yield s


def test_the_readme_runs_top_to_bottom(stack: LocalStack, tmp_path: Path) -> None:
    (tmp_path / "examples").symlink_to(ROOT / "examples")  # submitted from here, as from the repository
    home = tmp_path / "home"
    home.mkdir()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")},
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "HOME": str(home),
        "TRAINYARD_DATA_DIR": str(stack.data_dir),
        "COLUMNS": "200",
    }
    job_id = ""
    for written in marked_commands(README.read_text()):
        expect = EXPECTED[written]
        if PLACEHOLDER in written:
            assert job_id, f"{written!r} comes before any submit"
        command = written.replace(PLACEHOLDER, job_id)
        deadline = time.monotonic() + (90 if expect.again else 0)
        while True:
            done = subprocess.run(
                ["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
            )
            output = done.stdout + done.stderr
            shown = done.returncode == 0 and re.search(expect.shows, output, re.MULTILINE) is not None
            if shown or time.monotonic() >= deadline:
                break
            time.sleep(0.5)  # a poll of a condition with a deadline: the command is run again
        print(f"$ {command}\n{output}")  # shown by pytest when the test fails, with -s always
        assert done.returncode == 0, f"{command}\nexit {done.returncode}\n{output}"
        assert shown, f"{command}\ndoes not show {expect.shows!r}:\n{output}"
        if written.startswith("trainyard submit"):
            job_id = done.stdout.strip().splitlines()[0]
    assert (tmp_path / "report").is_dir()
