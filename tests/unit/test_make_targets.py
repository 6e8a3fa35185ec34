"""What each make target installs, read from ``make -n`` (nothing is run): ``up``
the runtime only, ``test`` and ``lint`` the dev tools, ``chromium`` only for the
tests, and an up-to-date stamp installs nothing again."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def planned(target: str, venv: Path) -> str:
    """The commands ``make TARGET`` would run for a virtualenv at ``venv`` (none active)."""
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    result = subprocess.run(
        ["make", "-n", target, f"VENV={venv}"], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    return result.stdout


@pytest.mark.parametrize(
    ("target", "installs", "not_installed"),
    [
        pytest.param("up", ".ci/install {venv}/bin/python runtime", ".ci/install {venv}/bin/python dev", id="up"),
        pytest.param("test", ".ci/install {venv}/bin/python dev", ".ci/install {venv}/bin/python runtime", id="test"),
        pytest.param("lint", ".ci/install {venv}/bin/python dev", "chromium", id="lint"),
    ],
)
def test_a_fresh_clone_installs_what_the_target_needs(tmp_path: Path, target, installs, not_installed):
    venv = tmp_path / "venv"
    plan = planned(target, venv)
    assert f"python3 -m venv --without-pip {venv}" in plan
    assert installs.format(venv=venv) in plan
    assert not_installed.format(venv=venv) not in plan
    assert ("apt-get install -y chromium" in plan) == (target == "test")


def test_up_after_a_dev_install_installs_nothing(tmp_path: Path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    (venv / ".trainyard-installed").touch()  # newer than pyproject.toml
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    stamp = venv / ".trainyard-runtime-installed"
    made = subprocess.run(
        ["make", str(stamp), f"VENV={venv}"], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    assert stamp.is_file() and "Installing" not in made.stdout + made.stderr  # the dev install covers it
    plan = planned("up", venv)
    assert ".ci/install" not in plan and "python3 -m venv" not in plan
    assert f"{venv}/bin/python -m trainyard.cli.main up" in plan
