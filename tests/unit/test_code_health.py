"""Two rules of CONTRIBUTING.md kept by a test: settings are read in one place
(trainyard.settings), and no module grows past ~400 lines."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SETTINGS_MODULE = "libs/trainyard/settings.py"
#: Test fixtures choose their own servers (TRAINYARD_REDIS_SERVER and the like).
TESTING = "libs/trainyard/testing/"
#: Not a read of a setting: ``trainyard up`` hands its own environment on to
#: the processes it starts.  Path -> the only line there that may touch it.
PASSES_ON = {"libs/trainyard/local/stack.py": "for k, v in os.environ.items() if k not in _CREDENTIAL_SETTINGS"}
ENVIRONMENT = {"environ", "environb", "getenv", "getenvb"}
MAX_LINES = 400
GENERATED = "libs/trainyard/_pb/"


def python_files(*tops: str) -> list[Path]:
    return sorted(p for top in tops for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts)


def environment_reads(path: Path) -> list[tuple[int, str]]:
    """Each place ``path`` reaches the process environment: ``os.environ``,
    ``os.getenv`` and the like, or ``from os import environ``."""
    source = path.read_text()
    lines = source.splitlines()
    return sorted(
        (node.lineno, lines[node.lineno - 1].strip())
        for node in ast.walk(ast.parse(source, filename=str(path)))
        if _reaches_the_environment(node)
    )


def _reaches_the_environment(node: ast.AST) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr in ENVIRONMENT and isinstance(node.value, ast.Name) and node.value.id == "os"
    if isinstance(node, ast.ImportFrom):
        return node.module == "os" and bool(ENVIRONMENT & {a.name for a in node.names})
    return False


def test_only_the_settings_module_reads_the_environment() -> None:
    offenders = []
    for path in python_files("libs", "services"):
        name = path.relative_to(ROOT).as_posix()
        if name == SETTINGS_MODULE or name.startswith(TESTING):
            continue
        for line, text in environment_reads(path):
            if name in PASSES_ON and PASSES_ON[name] in text:
                continue
            offenders.append(f"{name}:{line}: {text}")
    assert offenders == [], "read settings through trainyard.settings (a field of Settings), not the environment"


def test_the_environment_check_sees_every_way_in(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        'import os\nfrom os import getenv\na = os.environ.get("X")\nb = os.getenv("Y")\nc = "X" in os.environ\n'
    )

    assert [line for line, _ in environment_reads(bad)] == [2, 3, 4, 5]
    assert environment_reads(ROOT / SETTINGS_MODULE), "the settings module reads the environment"
    for name, text in PASSES_ON.items():
        assert any(text in found for _, found in environment_reads(ROOT / name)), (
            f"{name} no longer needs its exception"
        )


def lines_of(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_no_module_is_over_400_lines() -> None:
    too_long = {
        name: lines_of(path)
        for path in python_files("libs", "services", "bench")
        if not (name := path.relative_to(ROOT).as_posix()).startswith(GENERATED) and lines_of(path) > MAX_LINES
    }
    assert too_long == {}, f"split these along their seams (CONTRIBUTING.md, principle 12): {too_long}"
