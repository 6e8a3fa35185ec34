"""bench/launch.py --quick: the launch benchmark runs end to end on real
agents, so the script cannot rot (bench/launch.py runs the long version)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def test_the_quick_launch_benchmark_starts_every_run_it_placed_and_reports_the_agents_cost() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "launch.py"), "--quick", "--json"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    report = json.loads(done.stdout)
    assert report["settings"]["agents"] == report["agents_healthy"] == 2
    assert report["jobs_offered"] == report["runs_placed"] == report["runs_started"] == 20
    for key in ("placed_to_order", "placed_to_node_started", "placed_to_run_started"):
        assert 0 < report[key]["p50_ms"] <= report[key]["p99_ms"] <= report[key]["max_ms"], report[key]
    assert sum(v["launches"] for v in report["agent_cpu_per_launch"].values()) >= 20
    assert set(report["agent_rss_mib"]) == set(report["idle_agent_cpu_s_per_s"]) == {"a00", "a01"}
    assert all(mib > 0 for mib in report["agent_rss_mib"].values())
