"""The placement core is pure: no I/O, clocks, randomness or logging; only stdlib types, msgspec and Trainyard."""

import ast
import pathlib

import pytest

import trainyard.core.placement

CORE = pathlib.Path(trainyard.core.placement.__file__).parent
ALLOWED_TOP = {"__future__", "collections", "enum", "itertools", "typing", "msgspec", "trainyard"}
ALLOWED_TRAINYARD = ("trainyard.core", "trainyard.domain", "trainyard.events")


def imports(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            yield node.module


@pytest.mark.parametrize(
    "path", sorted(CORE.glob("*.py")), ids=lambda p: f"{p.name} imports nothing with I/O, clocks or randomness"
)
def test_placement_core_imports(path):
    for name in imports(path):
        assert name.split(".")[0] in ALLOWED_TOP, f"{path.name} imports {name}"
        if name.startswith("trainyard"):
            assert name.startswith(ALLOWED_TRAINYARD), f"{path.name} imports {name}"


def test_the_core_modules_are_found():
    expected = {"topology.py", "gang.py", "scoring.py", "backfill.py", "preemption.py", "cycle.py", "snapshot.py"}
    assert expected <= {p.name for p in CORE.glob("*.py")}
