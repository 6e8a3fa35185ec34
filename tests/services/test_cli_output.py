"""The ``trainyard`` command run as a user runs it, piped into other
programs, against a gateway on real NATS and Redis: tables are printed whole
(never cut to 80 columns), every list and show command takes ``-o
table|wide|json|yaml|name`` and ``--no-headers``, ``--json`` stays an alias,
a job shows its name, times, elapsed time and nodes, and the stack is found
from a directory below its data directory or from the per-user config."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from cli_fixtures import LONG_NAME, NODES, served, trainyard, user_env

from trainyard.bus import Bus
from trainyard.cli.discovery import remember_stack
from trainyard.store import Store
from trainyard.testing.auth import Callers


@pytest.fixture
async def gateway(bus: Bus, store: Store, callers: Callers, tmp_path: Path) -> AsyncIterator[str]:
    async with served(bus, store, callers, tmp_path) as url:
        yield url


async def test_piped_jobs_are_printed_whole_so_grep_and_awk_see_every_cell(
    gateway: str, callers: Callers, tmp_path: Path
) -> None:
    base = ["--token", callers.tokens["admin"]]
    listed = await trainyard(*base, "jobs", "--api-url", gateway, home=tmp_path)

    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["JOB", "NAME", "TENANT", "QUEUE", "GPUS", "STATUS", "ELAPSED", "NODES", "AGE", "REASON"]
    assert "…" not in listed.stdout and "│" not in listed.stdout
    running = [line for line in lines if "running" in line]  # `trainyard jobs | grep running`
    assert sorted(line.split()[0] for line in running) == ["cli-long", "cli-short"]
    long = next(line.split() for line in lines if line.startswith("cli-long"))
    assert long[1] == LONG_NAME and long[4] == "40" and long[5] == "running"
    assert long[6].startswith("1:02:") and long[7] == ",".join(NODES[:3]) + ",+2"
    done = next(line.split() for line in lines if line.startswith("cli-done"))
    assert done[5] == "succeeded" and done[6] == "1:35" and done[7] == NODES[1]  # elapsed is start to end; where it ran
    bad = next(line for line in lines if line.startswith("cli-bad"))
    assert "rejected" in bad and "tenant: unknown tenant 'nobody'" in bad  # why, not a blank cell
    assert all(len(line.split()) >= 9 for line in lines[1:])  # an empty cell is "-": awk counts fields

    bare = await trainyard(*base, "jobs", "--no-headers", "--api-url", gateway, home=tmp_path)

    def still(line: str) -> list[str]:  # all but the clock's columns (elapsed, age), which move between the runs
        fields = line.split()
        return fields[:6] + fields[7:8] + fields[9:]

    assert [still(line) for line in bare.stdout.splitlines()] == [still(line) for line in lines[1:]]


@pytest.mark.parametrize("flag", [["-o", "json"], ["--json"], ["--output", "JSON"]])
async def test_json_is_the_api_s_jobs_and_json_stays_an_alias(
    gateway: str, callers: Callers, tmp_path: Path, flag: list[str]
) -> None:
    listed = await trainyard("--token", callers.tokens["admin"], "jobs", *flag, "--api-url", gateway, home=tmp_path)

    jobs = json.loads(listed.stdout)
    assert {j["job_id"] for j in jobs} == {"cli-long", "cli-short", "cli-done", "cli-wait", "cli-bad"}
    assert next(j for j in jobs if j["job_id"] == "cli-long")["name"] == LONG_NAME


async def test_every_format_of_the_list_and_show_commands(gateway: str, callers: Callers, tmp_path: Path) -> None:
    base = ["--token", callers.tokens["admin"]]

    async def run(*args: str) -> str:
        done = await trainyard(*base, *args, "--api-url", gateway, home=tmp_path)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert sorted((await run("jobs", "-o", "name")).split()) == [
        "cli-bad",
        "cli-done",
        "cli-long",
        "cli-short",
        "cli-wait",
    ]
    wide = (await run("jobs", "-o", "wide")).splitlines()
    assert {"PRIORITY", "RUN"} <= set(wide[0].split())
    assert ",".join(NODES) in next(line for line in wide if line.startswith("cli-long"))  # wide names every node
    as_yaml = yaml.safe_load(await run("jobs", "-o", "yaml", "--status", "running"))
    assert sorted(j["job_id"] for j in as_yaml) == ["cli-long", "cli-short"]

    assert (await run("nodes", "-o", "name")).split() == NODES
    nodes = (await run("nodes", "--no-headers")).splitlines()
    assert len(nodes) == len(NODES) and all(line.split()[2] == "H100" for line in nodes)
    assert json.loads(await run("nodes", "--json"))[0]["node_id"] == NODES[0]

    assert json.loads(await run("job", "cli-done", "-o", "json"))["name"] == "finished"
    assert yaml.safe_load(await run("job", "cli-done", "-o", "yaml"))["status"] == "succeeded"
    assert (await run("job", "cli-done", "-o", "name")).strip() == "cli-done"


async def test_a_job_shows_its_name_times_elapsed_time_and_nodes(
    gateway: str, callers: Callers, tmp_path: Path
) -> None:
    shown = await trainyard("--token", callers.tokens["admin"], "job", "cli-done", "--api-url", gateway, home=tmp_path)

    assert shown.returncode == 0, shown.stderr
    fields = {
        line.split()[0]: line.split(None, 1)[1] for line in shown.stdout.splitlines()[1:] if line.startswith("  ")
    }
    assert fields["name"] == "finished" and fields["elapsed"] == "1:35" and fields["nodes"] == NODES[1]
    for label in ("submitted", "started", "ended"):
        assert fields[label][:2] == "20", fields  # a date, e.g. 2026-12-07 18:40:00 UTC


async def test_the_stack_is_found_from_a_directory_below_its_data_directory(
    gateway: str, callers: Callers, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    data = project / ".trainyard"
    data.mkdir(parents=True)
    (data / "state.json").write_text(json.dumps({"api_url": gateway}))
    (data / "admin-token").write_text(callers.tokens["admin"] + "\n")
    deep = project / "src" / "models"
    deep.mkdir(parents=True)

    listed = await trainyard("jobs", "-o", "name", home=tmp_path, cwd=deep)

    assert listed.returncode == 0, listed.stderr
    assert "cli-long" in listed.stdout.split()


async def test_the_stack_is_found_from_the_per_user_config_anywhere(
    gateway: str, callers: Callers, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "stacks" / "main"
    data.mkdir(parents=True)
    (data / "admin-token").write_text(callers.tokens["admin"] + "\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    remember_stack(gateway, data)  # as `trainyard up` does once it is up

    listed = await trainyard("jobs", "-o", "name", home=home, cwd=elsewhere)

    assert listed.returncode == 0, listed.stderr
    assert "cli-short" in listed.stdout.split()


async def test_jobs_loads_none_of_the_services_libraries(gateway: str, callers: Callers, tmp_path: Path) -> None:
    script = (
        "import sys\n"
        "from trainyard.cli.main import app\n"
        f"sys.argv = ['trainyard', '--token', {callers.tokens['admin']!r}, 'jobs', '--api-url', {gateway!r}]\n"
        "try:\n    app()\nexcept SystemExit:\n    pass\n"
        "print(' '.join(sorted(sys.modules)), file=sys.stderr)\n"
    )
    heavy = ("fastapi", "starlette", "uvicorn", "grpc", "nats", "redis", "pyarrow", "matplotlib", "trainyard_gateway")
    heavy += (
        "httpx",
        "pydantic",
        "trainyard.bus",
        "trainyard.store",
        "trainyard.auth",
        "trainyard.local",
        "trainyard.config",
    )
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", script], capture_output=True, text=True, env=user_env(tmp_path)
    )

    assert "cli-long" in done.stdout
    assert [m for m in done.stderr.split() if m.startswith(heavy)] == []


async def test_the_other_list_and_show_commands_take_the_same_flags(
    gateway: str, callers: Callers, tmp_path: Path
) -> None:
    base = ["--token", callers.tokens["admin"]]

    async def run(*args: str) -> str:
        done = await trainyard(*base, *args, "--api-url", gateway, home=tmp_path)
        assert done.returncode == 0, done.stderr
        return done.stdout

    tokens = json.loads(await run("auth", "token", "list", "-o", "json"))
    assert sorted((await run("auth", "token", "list", "-o", "name")).split()) == sorted(t["id"] for t in tokens)
    listed = (await run("auth", "token", "list", "--no-headers")).splitlines()
    assert len(listed) == len(tokens) and not listed[0].startswith("ID")

    assert json.loads(await run("dlq", "list", "-o", "json")) == []
    assert yaml.safe_load(await run("dlq", "list", "-o", "yaml")) == []

    history = yaml.safe_load(await run("node", "history", NODES[0], "-o", "yaml"))
    assert history["node_id"] == NODES[0]
    assert json.loads(await run("node", "history", NODES[0], "--json"))["node_id"] == NODES[0]


async def test_submit_posts_the_job_and_prints_its_id_then_the_next_step(
    gateway: str, callers: Callers, tmp_path: Path
) -> None:
    argv = ["--token", callers.tokens["admin"], "submit", "--tenant", "acme", "--gpus", "2", "--wait", "0"]
    done = await trainyard(*argv, "--job-id", "cli-new", "--api-url", gateway, home=tmp_path, cwd=tmp_path)

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "cli-new"  # only the id on stdout: `JOB=$(trainyard submit ...)`
    assert "next: trainyard job cli-new" in done.stderr


async def test_a_job_with_a_long_name_shows_it_on_one_line_when_piped(
    gateway: str, callers: Callers, tmp_path: Path
) -> None:
    shown = await trainyard("--token", callers.tokens["admin"], "job", "cli-long", "--api-url", gateway, home=tmp_path)

    assert shown.returncode == 0, shown.stderr
    assert f"  name       {LONG_NAME}" in shown.stdout.splitlines()
    assert f"  nodes      {','.join(NODES)}" in shown.stdout.splitlines()


async def test_usage_takes_the_same_flags(gateway: str, callers: Callers, tmp_path: Path) -> None:
    base = ["--token", callers.tokens["admin"], "usage", "--api-url", gateway]

    as_json = await trainyard(*base, "-o", "json", home=tmp_path)
    table = await trainyard(*base, home=tmp_path)

    assert as_json.returncode == 0 and json.loads(as_json.stdout) == [], as_json.stderr  # an empty ledger
    assert table.returncode == 0 and table.stdout.split() == ["TENANT", "GPU_SECONDS"]
