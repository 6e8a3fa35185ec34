"""Where the ledger lives when nobody says: an absolute SQLite path under the
data directory, never a file relative to whatever directory a process was
started from (which once left ``trainyard-ledger.db-wal`` in the repository)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainyard.ledger import Ledger
from trainyard.local.stack import LocalStack, StackConfig
from trainyard.settings import load_settings


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        pytest.param(
            {}, ".trainyard/ledger.db", id="no settings at all: .trainyard/ledger.db under the start directory"
        ),
        pytest.param(
            {"TRAINYARD_DATA_DIR": "state"},
            "state/ledger.db",
            id="a relative data directory is resolved once, at start",
        ),
        pytest.param(
            {"TRAINYARD_DATA_DIR": "{tmp}/elsewhere"},
            "elsewhere/ledger.db",
            id="an absolute data directory holds the ledger",
        ),
    ],
)
def test_a_service_without_a_ledger_url_keeps_the_ledger_absolute_under_its_data_dir(
    environ: dict[str, str], expected: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    settings = load_settings({k: v.format(tmp=tmp_path) for k, v in environ.items()})

    assert settings.ledger_url == f"sqlite:///{tmp_path / expected}"
    assert Path(settings.ledger_url.removeprefix("sqlite:///")).is_absolute()
    assert not (tmp_path / expected).parent.exists()  # reading the settings writes nothing
    with Ledger(settings.ledger_url) as ledger:
        ledger.create_schema()
    assert (tmp_path / expected).is_file()  # the ledger makes the directory; SQLite makes only the file


def test_a_ledger_url_that_is_set_is_used_as_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    url = "postgresql+psycopg://ledger@db.internal/trainyard"

    assert load_settings({"TRAINYARD_LEDGER_URL": url}).ledger_url == url


def test_trainyard_up_hands_every_process_the_ledger_under_its_resolved_data_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)

    stack = LocalStack(StackConfig(data_dir="run"))

    assert stack.ledger_url == f"sqlite:///{tmp_path / 'run' / 'ledger.db'}"
