"""Where the command line finds the stack, in order: the option, the
environment, a running stack's ``.trainyard`` in the current directory or
above, the per-user config ``trainyard up`` writes, then the default; and
what ``trainyard --help`` leaves unloaded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainyard.cli.discovery import (
    DEFAULT_API_URL,
    find_api_url,
    find_data_dir,
    read_user_config,
    remember_stack,
    user_config_path,
)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "home"
    folder.mkdir()
    monkeypatch.setenv("HOME", str(folder))
    return folder


def running_stack(folder: Path, api_url: str) -> Path:
    data = folder / ".trainyard"
    data.mkdir(parents=True)
    (data / "state.json").write_text(json.dumps({"api_url": api_url, "pid": 1}))
    return data


def test_the_order_option_environment_directories_user_config_default(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project, deep = tmp_path / "project", tmp_path / "project" / "a" / "b"
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)
    assert find_api_url(None, "", None) == DEFAULT_API_URL and find_data_dir(None) == ".trainyard"

    remembered = tmp_path / "remembered"
    remembered.mkdir()
    remember_stack("http://127.0.0.1:7001", remembered)
    assert find_api_url(None, "", None) == "http://127.0.0.1:7001"
    assert find_data_dir(None) == str(remembered.resolve())

    data = running_stack(project, "http://127.0.0.1:7002")
    assert find_api_url(None, "", None) == "http://127.0.0.1:7002"  # the nearest stack beats the user config
    assert find_data_dir(".trainyard") == str(data)  # the option's default searches too

    other = running_stack(tmp_path / "other", "http://127.0.0.1:7003")
    assert find_api_url(None, "", str(other)) == "http://127.0.0.1:7003"  # --data-dir / TRAINYARD_DATA_DIR
    assert find_api_url(None, "http://env:8080", str(other)) == "http://env:8080"  # TRAINYARD_API_URL
    assert find_api_url("http://flag:8080", "http://env:8080", str(other)) == "http://flag:8080"


def test_a_remembered_stack_that_stopped_still_names_its_url(tmp_path: Path, home: Path) -> None:
    remember_stack("http://127.0.0.1:7004", tmp_path / "gone")  # its data directory was removed since

    assert read_user_config() == {"api_url": "http://127.0.0.1:7004", "data_dir": str((tmp_path / "gone").resolve())}
    assert find_api_url(None, "", None) == "http://127.0.0.1:7004"


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("[stack\napi_url = ", id="not TOML"),
        pytest.param("stack = 3\n", id="stack is not a table"),
        pytest.param("[stack]\napi_url = 3\n", id="the URL is not text"),
    ],
)
def test_a_broken_user_config_is_passed_over(tmp_path: Path, home: Path, monkeypatch, text: str) -> None:  # type: ignore[no-untyped-def]
    user_config_path().parent.mkdir(parents=True)
    user_config_path().write_text(text)
    monkeypatch.chdir(tmp_path)

    assert find_api_url(None, "", None) == DEFAULT_API_URL


HEAVY = ("fastapi", "starlette", "uvicorn", "grpc", "nats", "redis", "pyarrow", "matplotlib", "trainyard_gateway")
HEAVY_FOR_HELP = (*HEAVY, "httpx", "yaml", "asyncio", "trainyard.bus", "trainyard.store", "trainyard.auth")


def test_help_loads_none_of_the_heavy_libraries() -> None:
    script = (
        "import sys\n"
        "from trainyard.cli.main import app\n"
        "try:\n    app(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(' '.join(sorted(sys.modules)), file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)

    loaded = done.stderr.split()
    assert "Usage" in done.stdout
    assert [m for m in loaded if m.startswith(HEAVY_FOR_HELP)] == []


def test_up_names_its_stack_in_the_user_config_and_says_where(
    tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainyard.cli.up import _remember

    _remember("http://127.0.0.1:7005", tmp_path / "stack")

    assert read_user_config() == {"api_url": "http://127.0.0.1:7005", "data_dir": str((tmp_path / "stack").resolve())}
    assert str(user_config_path()) in "".join(capsys.readouterr().out.split())  # rich wraps a long path


def test_up_on_a_read_only_home_carries_on_with_a_note(tmp_path: Path, home: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    from trainyard.cli.up import _remember

    (home / ".config").write_text("a file where the folder would go")

    _remember("http://127.0.0.1:7006", tmp_path / "stack")

    assert "cannot write the per-user config" in capsys.readouterr().err


def test_a_stack_that_does_not_answer_is_named_with_where_it_was_found(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from trainyard.cli.main import app
    from trainyard.local.servers import free_port

    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    remember_stack(dead, tmp_path / "gone")
    monkeypatch.chdir(tmp_path)

    result = CliRunner().invoke(app, ["jobs"], env={"HOME": str(home), "TRAINYARD_API_URL": None})

    assert result.exit_code == 1
    said = "".join(result.output.split())
    assert f"cannotreachtheTrainyardAPIat{dead},from{user_config_path()}" in said
