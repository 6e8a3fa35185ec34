"""How tables print (trainyard.cli.output): plain aligned columns when piped,
rich on a terminal, and never a cell cut short in either."""

from __future__ import annotations

import io
import re

import pytest

from trainyard.cli.output import Column, Output, plain_table, print_items

LONG = "a-job-name-" + "x" * 100
ITEMS = [{"id": "j1", "name": LONG, "status": "running"}, {"id": "j2", "name": "", "status": "pending"}]
COLUMNS = [
    Column("id", lambda i: i["id"]),
    Column("name", lambda i: i["name"]),
    Column("status", lambda i: i["status"], wide=True),
]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_columns_are_aligned_whole_and_dash_for_empty() -> None:
    text = plain_table(["id", "name"], [["j1", LONG], ["j22", ""]])

    assert text.splitlines() == ["ID    NAME", f"j1    {LONG}", "j22   -"]
    assert plain_table(["id"], [["j1"]], no_headers=True) == "j1\n"
    assert plain_table(["id"], []) == "ID\n"


def test_wide_adds_its_columns_and_name_prints_ids(capsys: pytest.CaptureFixture[str]) -> None:
    print_items(ITEMS, COLUMNS, Output.table)
    assert capsys.readouterr().out.splitlines()[0].split() == ["ID", "NAME"]

    print_items(ITEMS, COLUMNS, Output.wide)
    assert capsys.readouterr().out.splitlines()[0].split() == ["ID", "NAME", "STATUS"]

    print_items(ITEMS, COLUMNS, Output.name)
    assert capsys.readouterr().out == "j1\nj2\n"


def test_on_a_narrow_terminal_a_long_cell_wraps_and_is_never_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = Terminal()
    monkeypatch.setattr("sys.stdout", terminal)
    monkeypatch.setenv("COLUMNS", "40")

    print_items(ITEMS, COLUMNS, Output.wide)

    shown = re.sub(r"\x1b\[[0-9;]*m", "", terminal.getvalue())  # without the header's bold
    assert "…" not in shown and "running" in shown
    assert "a-job-name-" in shown and shown.count("x") == 100  # every character of the name, over several lines
    assert max(len(line) for line in shown.splitlines()) <= 40
