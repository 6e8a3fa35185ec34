"""The repository stands on its own: no code, test, benchmark, setting or document
reads or names a path beside the checkout (the traces once lived in ../shared/traces;
they are in traces/ now, or fetched by ``trainyard traces fetch``)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from trainyard.sim.sources import SOURCES

ROOT = Path(__file__).resolve().parents[2]
OUTSIDE = re.compile(r"\.\./shared|shared/traces|/work/shared|parents\[\d\]\.parent\b")
SKIPPED = {".git", ".venv", "node_modules", "__pycache__", ".trainyard", "build", "dist"}
THIS = Path(__file__).resolve()


def tracked() -> list[Path]:
    """The files git tracks and would add (else, outside a git checkout, every file but build output)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
        return [ROOT / name for name in listed if (ROOT / name).is_file()]
    except (OSError, subprocess.CalledProcessError):
        return [p for p in ROOT.rglob("*") if p.is_file() and not SKIPPED & set(p.relative_to(ROOT).parts)]


def test_nothing_in_the_repository_names_a_path_outside_it() -> None:
    found = []
    for path in tracked():
        if path.resolve() == THIS or path.suffix in {".csv", ".parquet", ".png", ".ico", ".woff2"}:
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        found += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in OUTSIDE.finditer(text)]
    assert not found, f"paths outside the repository: {found}"


def test_every_document_the_code_and_tests_cite_is_in_the_repository() -> None:
    """A module or test that says "see CONVENTIONS.md" points at a file the repository holds."""
    names = {p.relative_to(ROOT).as_posix() for p in tracked() if p.suffix == ".md"}
    names |= {source.path for source in SOURCES}  # fetched by `trainyard traces fetch`, pinned there
    basenames = {name.rsplit("/", 1)[-1] for name in names}
    missing = set()
    for path in tracked():
        if path.suffix != ".py" or path.resolve() == THIS:
            continue
        for cited in re.findall(r"(?<![\w./-])([\w./-]*[A-Za-z]\.md)\b", path.read_text()):
            if cited not in names and f"docs/{cited}" not in names and cited.rsplit("/", 1)[-1] not in basenames:
                missing.add(f"{path.relative_to(ROOT)}: {cited}")
    assert not missing, f"cited documents the repository lacks: {sorted(missing)}"
