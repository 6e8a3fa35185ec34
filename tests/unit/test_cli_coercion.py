"""Options converted without pydantic (trainyard.cli.coercion) are refused
as typer refuses them, and the kinds it leaves to typer still are."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from trainyard.cli import coercion
from trainyard.cli.main import app


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200", "TRAINYARD_API_URL": "http://127.0.0.1:9"})
    return result.exit_code, " ".join(result.output.split())


def test_it_is_installed() -> None:
    assert coercion.install()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        pytest.param(
            ["jobs", "--limit", "many"],
            "Invalid value for '--limit': 'many' is not a whole number",
            id="a word for a number",
        ),
        pytest.param(["jobs", "--limit", "2.5"], "'2.5' is not a whole number", id="a fraction for a whole number"),
        pytest.param(
            ["jobs", "-o", "csv"], "'csv' is not one of 'table', 'wide', 'json', 'yaml', 'name'", id="an unknown format"
        ),
        pytest.param(
            ["up", "--agents", "999"], "Invalid value for '--agents'", id="a bounded number is still checked by typer"
        ),
    ],
)
def test_bad_values_are_refused_naming_the_option(args: list[str], said: str) -> None:
    code, out = run(*args)

    assert code == 2 and said in out


def test_good_values_reach_the_command() -> None:
    code, out = run("jobs", "--limit", " 7 ", "-o", "NAME", "--tenant", "acme")  # the command then finds no gateway

    assert code == 1 and "cannot reach the Trainyard API at http://127.0.0.1:9" in out
