"""The quota invariant and the admission core's import rules."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from admission_builders import queue, running, tenancy

from trainyard.core.admission import check_quota

CORE = Path(__file__).resolve().parents[3] / "libs" / "trainyard" / "core" / "admission"
ALLOWED = ("trainyard.core", "trainyard.domain", "trainyard.events", "msgspec", "__future__")
STDLIB_OK = {
    "bisect",
    "heapq",
    "math",
    "typing",
    "operator",
    "collections",
    "enum",
    "itertools",
    "functools",
    "dataclasses",
}


@pytest.mark.parametrize("module", sorted(p.name for p in CORE.glob("*.py")))
def test_the_admission_core_imports_only_the_standard_library_msgspec_and_the_core(module):
    tree = ast.parse((CORE / module).read_text())
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        for name in names:
            assert name.startswith(ALLOWED) or name.split(".")[0] in STDLIB_OK, f"{module} imports {name}"


@pytest.mark.parametrize(
    "holders, words",
    [
        pytest.param([running("r", 24, "a")], None, id="borrowing an idle sibling's quota is within limits"),
        pytest.param(
            [running("r", 24, "a"), running("s", 16, "b")],
            "exceeds the tree's",
            id="a lender and a borrower together beyond the tree",
        ),
        pytest.param([running("r", 8, "nobody")], "outside the quota tree", id="a job in no queue of the tree"),
        pytest.param(
            [running("r", 8, "b", gpu="A100")],
            "more than its nominal quota",
            id="a type the queue's quota does not list",
        ),
    ],
)
def test_check_quota_reports_every_broken_limit(holders, words):
    tree = tenancy(queue("a", H100=16, A100=0), queue("b", H100=16))
    problems = check_quota(tree, holders)
    if words is None:
        assert problems == []
    else:
        assert problems and words in problems[0]
