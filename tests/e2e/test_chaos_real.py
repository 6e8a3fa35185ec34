"""bench/chaos.py --real --quick: real processes on two agents while one is
SIGKILLed and restarted, with gangs, a failing rank, cancels and a
preemption; checked from /proc, the log, the agents' state and the ledger
(bench/chaos.py --real runs the long version)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def test_a_quick_real_chaos_run_loses_nothing_and_never_runs_a_job_twice_at_once() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "chaos.py"), "--real", "--quick", "--json"],
        capture_output=True,
        text=True,
        timeout=280,
    )
    report = json.loads(done.stdout)
    assert report["plan"]["agents"] == 2 and report["plan"]["jobs"] == 40, report["plan"]
    assert report["accepted"] == 40, report
    assert sum(report["faults"].values()) == 1 and sum(report["restarts"].values()) >= 1, report
    assert (report["lost"], report["stuck_placed"], report["log_double_allocations"]) == (0, 0, 0), report
    assert report["twice_at_once"] == {} and report["gpu_shared"] == {}, report
    assert report["lists"]["compared"] == 40 and report["lists"].get("unlisted", 0) == 0, report["lists"]
    assert report["lists"].get("listed_wrongly", 0) == 0, report["lists"]
    assert report["live"]["samples"] > 0 and report["live"]["max_live"] > 0, report["live"]
    assert report["ledger"]["compared"] > 0, report["ledger"]
    assert set(report["statuses"]) <= {"succeeded", "failed", "cancelled"}, report["statuses"]
    assert report["statuses"].get("failed", 0) >= 1, report["statuses"]  # the jobs whose rank 1 exits 3
