"""Files given to the CLI (a job spec, a tenancy file) that cannot be used fail with what to fix, never a traceback.

Each of these fails before any server is asked, so the API URL points at a closed port.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainyard.cli.main import app

CLOSED = "http://127.0.0.1:9"


def run(*args: str):  # type: ignore[no-untyped-def]
    # wide enough that no message is folded inside a temporary path, however long its folder's name
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "400"})


@pytest.mark.parametrize(
    "name, data, says",
    [
        pytest.param("job.yaml", b"\x81\xfe tenant: a", "is not UTF-8 text (byte 0x81 at offset 0)", id="not UTF-8"),
        pytest.param("job.json", b"[" * 100_000 + b"]" * 100_000, "is nested too deeply", id="nested JSON"),
        pytest.param("job.yaml", b"[" * 100_000 + b"]" * 100_000, "nesting depth", id="nested YAML"),
        pytest.param("job.json", b"[1, 2]", "must hold one job spec", id="not a mapping"),
        pytest.param("job.json", b"{tenant: a", "cannot read the job spec", id="not JSON"),
    ],
)
def test_a_job_spec_that_is_no_spec_fails_before_anything_is_sent(tmp_path: Path, name, data, says) -> None:
    path = tmp_path / name
    path.write_bytes(data)
    result = run("submit", "-f", str(path), "--api-url", CLOSED)
    assert result.exit_code == 1
    assert says in " ".join(result.output.split())
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_a_job_spec_that_is_a_folder_says_it_cannot_be_read(tmp_path: Path) -> None:
    result = run("submit", "-f", str(tmp_path), "--api-url", CLOSED)
    assert result.exit_code == 1
    assert "cannot read the job spec" in result.output and "Is a directory" in result.output


def test_a_tenancy_file_that_is_not_utf8_is_named_with_the_byte(tmp_path: Path) -> None:
    path = tmp_path / "tenancy.yaml"
    path.write_bytes(b"organisations:\n  - name: \xe6\n")
    result = run("config", "validate", str(path))
    assert result.exit_code == 1
    assert "the tenancy file" in result.output
    assert "is not UTF-8 text (byte 0xe6 at offset 25)" in " ".join(result.output.split())


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["config", "show"], id="config show"),
        pytest.param(["admin", "rebuild"], id="admin rebuild (which would flush the projections)"),
        pytest.param(["emulate", "inject", "--node", "n00", "--xid", "79"], id="emulate inject"),
    ],
)
def test_with_no_stack_and_no_address_a_command_says_so_rather_than_using_the_standard_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    """Port 4222 and 6379 may be some other NATS and Redis on this machine: nothing is written there."""
    for variable in ("TRAINYARD_NATS_URL", "TRAINYARD_REDIS_URL", "TRAINYARD_DATA_DIR"):
        monkeypatch.delenv(variable, raising=False)

    result = run(*args, "--data-dir", str(tmp_path))

    assert result.exit_code == 1
    said = " ".join(result.output.split())
    assert "no Trainyard here: no `trainyard up` is running with data dir" in said
    assert "TRAINYARD_NATS_URL" in said
