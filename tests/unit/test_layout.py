"""The import direction of CONTRIBUTING.md: services -> trainyard, never back;
no service imports another; the pure core, domain and events import only the
standard library, msgspec and each other."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIBS = ROOT / "libs" / "trainyard"
SERVICES = sorted(p.name for p in (ROOT / "services").iterdir() if (p / f"trainyard_{p.name}").is_dir())
PURE = ("core", "domain", "events")
PURE_ALLOWED = {"msgspec", *(f"trainyard.{p}" for p in PURE)}


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def allowed_in_pure(module: str) -> bool:
    top = module.split(".")[0]
    if top in sys.stdlib_module_names or top == "__future__":
        return True
    return any(module == a or module.startswith(a + ".") for a in PURE_ALLOWED)


@pytest.mark.parametrize(
    "package", PURE, ids=[f"trainyard.{p} imports only the stdlib, msgspec and the pure packages" for p in PURE]
)
def test_pure_packages_import_nothing_else(package: str) -> None:
    offenders = {
        f"{path.relative_to(ROOT)}: {module}"
        for path in (LIBS / package).rglob("*.py")
        for module in imports_of(path)
        if not allowed_in_pure(module)
    }
    assert offenders == set()


def test_the_shared_package_never_imports_a_service() -> None:
    offenders = {
        f"{path.relative_to(ROOT)}: {module}"
        for path in LIBS.rglob("*.py")
        for module in imports_of(path)
        if module.split(".")[0].startswith("trainyard_")
    }
    assert offenders == set()


@pytest.mark.parametrize("service", SERVICES)
def test_a_service_never_imports_another_service(service: str) -> None:
    others = {f"trainyard_{s}" for s in SERVICES if s != service}
    offenders = {
        f"{path.relative_to(ROOT)}: {module}"
        for path in (ROOT / "services" / service).rglob("*.py")
        for module in imports_of(path)
        if module.split(".")[0] in others
    }
    assert offenders == set()


def test_the_checks_see_every_service_and_catch_a_forbidden_import(tmp_path: Path) -> None:
    assert set(SERVICES) >= {"admission", "placement", "health", "accounting", "gateway"}
    bad = tmp_path / "bad.py"
    bad.write_text("import redis\nfrom trainyard.bus import Bus\nimport json\n")
    assert {m for m in imports_of(bad) if not allowed_in_pure(m)} == {"redis", "trainyard.bus"}


def imports_from_testing(path: Path) -> set[str]:
    """The modules of trainyard.testing that ``path`` imports (``from
    trainyard.testing import fakes`` counts as trainyard.testing.fakes)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("trainyard.testing"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "trainyard.testing":
                found.update(f"trainyard.testing.{a.name}" for a in node.names)
            elif node.module.startswith("trainyard.testing."):
                found.add(node.module)
    return found


def test_production_code_never_imports_the_fakes_or_other_test_helpers() -> None:
    production = [
        *(p for p in LIBS.rglob("*.py") if not p.is_relative_to(LIBS / "testing")),
        *(ROOT / "services").rglob("*.py"),
    ]
    offenders = {f"{path.relative_to(ROOT)}: {module}" for path in production for module in imports_from_testing(path)}
    assert offenders == set(), (
        "production code must not depend on trainyard.testing (the servers `trainyard up` starts are trainyard.local.servers)"
    )


def test_the_testing_import_check_sees_every_form(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import trainyard.testing.fakes\nfrom trainyard.testing import fakes\nfrom trainyard.testing.chaos import run\n"
    )
    assert imports_from_testing(bad) == {"trainyard.testing.fakes", "trainyard.testing.chaos"}
