"""The health core is pure: it imports only the standard library's harmless parts, msgspec and Trainyard types."""

import ast
import pathlib

import pytest

import trainyard.core.health

CORE = pathlib.Path(trainyard.core.health.__file__).parent
ALLOWED_TOP = {"__future__", "collections", "enum", "math", "typing", "msgspec", "trainyard"}
ALLOWED_TRAINYARD = ("trainyard.core.health", "trainyard.domain", "trainyard.gpu.nvml")


def imports(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            yield node.module


@pytest.mark.parametrize(
    "path", sorted(CORE.glob("*.py")), ids=lambda p: f"{p.name} imports nothing with I/O, clocks or randomness"
)
def test_health_core_imports(path):
    for name in imports(path):
        assert name.split(".")[0] in ALLOWED_TOP, f"{path.name} imports {name}"
        if name.startswith("trainyard"):
            assert name.startswith(ALLOWED_TRAINYARD), f"{path.name} imports {name}"


def test_the_core_modules_are_found():
    assert {"xid.py", "rules.py", "state.py", "fleet.py"} <= {p.name for p in CORE.glob("*.py")}
