"""bench/year_soak.py on a few thousand jobs: the soak runs end to end on a
real stack with retention on an accelerated clock, so the script cannot rot
(the long run is reported in docs/reliability.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
FLAGS = ["--jobs", "2000", "--batch", "100", "--sample-s", "0.5", "--retention-s", "0.2", "--sweep-s", "0.2"]
FLAGS += ["--snapshot-s", "1", "--stream-age-s", "20"]


def test_a_short_year_soak_publishes_every_job_samples_each_curve_and_rebuilds_after_a_flush() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "year_soak.py"), *FLAGS, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    report = json.loads(done.stdout)
    assert report["jobs_published"] == 2000
    assert report["rebuild"]["head_seq"] == report["events_published"] == 10_000
    curves = {"redis_used_mib", "jobs_stream_mib", "jobs_stream_msgs", "projection_jobs", "ledger_db_mib"}
    curves.add("projection_lag_events")
    processes = {"rss_admission_mib", "rss_nats-server_mib", "rss_redis-server_mib", "rss_publisher_mib"}
    assert len(report["samples"]) >= 2
    for row in report["samples"]:
        assert curves | processes <= set(row), row
    assert set(report["slopes_per_min_second_half"]) == curves | processes
    last = report["samples"][-1]
    # retention took finished jobs out of Redis into the archive, and JOBS holds every event published
    assert last["projection_jobs"] < 2000 and last["ledger_db_mib"] > 0.1, last
    assert last["jobs_stream_msgs"] == 10_000, last
    assert report["rebuild"]["seconds"] > 0
