"""The capacity report as files: HTML with inline SVG charts and a CSV per table."""

from __future__ import annotations

import csv
import io

from reports_builders import DAY, T0, job, run

from trainyard.reports import capacity_report, report_files
from trainyard.reports.render import CAPACITY_COLUMNS, WAIT_COLUMNS


def test_report_files_hold_html_with_charts_and_csv_with_every_row():
    report = capacity_report(
        [
            run(placed=2, ended=5),
            run("r2", "j2", "globex", placed=30, ended=31, outcome="failed:preempted", lost_hours=1),
        ],
        [job(accepted=0), job("j2", "globex", accepted=26)],
        {"H100": 16},
        T0,
        T0 + 3 * DAY,
        T0 + 3 * DAY,
    )

    files = report_files(report, "--capacity")

    html = files["capacity.html"]
    assert html.count("<svg") == 2 and "least-squares" in html and "globex" in html and "from --capacity" in html
    rows = list(csv.DictReader(io.StringIO(files["capacity.csv"])))
    assert tuple(rows[0]) == CAPACITY_COLUMNS and len(rows) == 3
    assert rows[0]["bucket_start"] == "2026-11-01T00:00:00Z" and rows[0]["allocated_gpu_hours"] == "24"
    waits = list(csv.DictReader(io.StringIO(files["queue_wait.csv"])))
    assert tuple(waits[0]) == WAIT_COLUMNS and [w["tenant"] for w in waits] == ["acme", "globex"]
    assert set(files) == {
        "capacity.html",
        "capacity.csv",
        "queue_wait.csv",
        "lost_work.csv",
        "trend.csv",
        "forecast.csv",
    }


def test_a_report_with_no_data_still_renders():
    files = report_files(capacity_report([], [], {}, T0, T0 + DAY, T0))

    assert "no usage and no capacity" in files["capacity.html"]
    assert files["capacity.csv"].splitlines() == [",".join(CAPACITY_COLUMNS)]
