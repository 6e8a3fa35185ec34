"""``trainyard export chargeback``: where the file goes (``--out``,
``TRAINYARD_EXPORT_DIR``, the stack's data dir, the user's data dir; never
the current directory unless told) and what the command says about it."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from accounting_builders import HOUR, T0, lifecycle, numbered
from typer.testing import CliRunner

from trainyard.cli.main import app
from trainyard_accounting.writer import LedgerWriter

CARD = {"versions": [{"version": "v1", "effective_from": "2026-01-01", "prices": {"H100": "2.00"}}]}


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path | str]:
    """A ledger with one run our hardware killed and one that succeeded, a rate
    card, an empty home, and a checkout-like current directory."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with LedgerWriter(url) as ledger:
        ledger.create_schema()
        events = lifecycle("r1", "j1", gpus=8, started_at=T0, ended_at=T0 + HOUR, outcome="node_failure")
        events += lifecycle("r2", "j2", gpus=1, started_at=T0, ended_at=T0 + HOUR)
        ledger.apply(numbered(events))
    card = tmp_path / "card.json"
    card.write_text(json.dumps(CARD))
    home, checkout = tmp_path / "home", tmp_path / "checkout"
    home.mkdir()
    checkout.mkdir()
    monkeypatch.chdir(checkout)
    return {"url": url, "card": card, "home": home, "checkout": checkout}


def export(setup, *args: str, **env: str) -> tuple[int, str]:
    argv = ["export", "chargeback", "--period", "2026-11", "--ledger-url", str(setup["url"])]
    argv += ["--rate-card", str(setup["card"]), *args]
    environment = {
        "COLUMNS": "400",
        "HOME": str(setup["home"]),
        "TRAINYARD_EXPORT_DIR": None,
        "TRAINYARD_DATA_DIR": None,
        **env,
    }
    result = CliRunner().invoke(app, argv, env=environment)
    return result.exit_code, result.output


def read(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(path.read_text())))


def test_with_no_stack_the_export_goes_to_the_users_data_dir_and_says_where(setup):
    code, said = export(setup)
    target = Path(setup["home"]) / ".local/share/trainyard/exports/chargeback-2026-11.csv"
    assert code == 0, said
    assert f"wrote {target}" in said
    assert "billed total 2.00 USD (gross 18.00, hardware-failure credit 16.00)" in said
    assert list(Path(setup["checkout"]).iterdir()) == []
    rows = read(target)
    assert [(r["ResourceId"], r["ChargeCategory"], r["BilledCost"]) for r in rows] == [
        ("r1", "Usage", "16.00"),
        ("r1", "Credit", "-16.00"),
        ("r2", "Usage", "2.00"),
    ]


def test_a_running_stacks_data_dir_gets_the_export(setup):
    data = Path(setup["checkout"]) / ".trainyard"
    data.mkdir()
    (data / "state.json").write_text("{}")
    code, said = export(setup)
    assert code == 0, said
    assert (data / "exports" / "chargeback-2026-11.csv").is_file()
    assert sorted(p.name for p in Path(setup["checkout"]).iterdir()) == [".trainyard"]


def test_the_setting_and_out_choose_the_directory_out_first(setup, tmp_path: Path):
    configured, given = tmp_path / "configured", tmp_path / "given" / "deeper"
    code, said = export(setup, "--format", "parquet", TRAINYARD_EXPORT_DIR=str(configured))
    assert code == 0, said
    assert (configured / "chargeback-2026-11.parquet").is_file()
    code, said = export(setup, "--out", str(given), TRAINYARD_EXPORT_DIR=str(configured))
    assert code == 0, said
    assert f"wrote {given / 'chargeback-2026-11.csv'}" in said
    assert len(read(given / "chargeback-2026-11.csv")) == 3


def test_out_and_output_together_are_refused_and_nothing_is_written(setup, tmp_path: Path):
    code, said = export(setup, "--out", str(tmp_path / "dir"), "--output", str(tmp_path / "file.csv"))
    assert code == 1
    assert "give --out DIR (a directory) or --output FILE, not both" in said
    assert not (tmp_path / "dir").exists() and not (tmp_path / "file.csv").exists()


def test_a_directory_that_cannot_be_written_says_what_to_do(setup, tmp_path: Path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, said = export(setup, "--out", str(blocker / "exports"))
    assert code == 1
    assert f"cannot write {blocker / 'exports' / 'chargeback-2026-11.csv'}" in said and "--out DIR" in said
