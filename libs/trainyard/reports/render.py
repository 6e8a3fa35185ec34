"""The capacity report as files: one HTML page with inline SVG charts, and a
CSV per table.  Pure: returns file names and their text."""

from __future__ import annotations

import csv
import datetime as dt
import io
from collections.abc import Iterable, Sequence
from html import escape
from typing import Any

from trainyard.redaction import redact
from trainyard.reports.capacity import CapacityReport, CapacityRow
from trainyard.reports.svg import Series, line_chart

CAPACITY_COLUMNS = (
    "bucket_start",
    "bucket_end",
    "gpu_type",
    "capacity_gpus",
    "capacity_gpu_hours",
    "allocated_gpu_hours",
    "pending_gpu_hours",
    "demand_gpu_hours",
    "utilisation",
)
WAIT_COLUMNS = ("tenant", "placements", "p50_s", "p90_s", "p99_s", "max_s", "mean_s", "still_waiting")
LOST_COLUMNS = ("tenant", "gpu_type", "runs_ended", "runs_lost_work", "gpu_hours", "lost_gpu_hours", "lost_share")
TREND_COLUMNS = (
    "gpu_type",
    "days",
    "slope_gpu_hours_per_day",
    "intercept_gpu_hours",
    "r2",
    "capacity_gpu_hours_per_day",
    "first_day_over_capacity",
)
FORECAST_COLUMNS = ("day_start", "gpu_type", "demand_gpu_hours", "capacity_gpu_hours")
_TIME_FIELDS = {"bucket_start", "bucket_end", "day_start", "first_day_over_capacity"}


def iso(at: float | None) -> str:
    if at is None:
        return ""
    return dt.datetime.fromtimestamp(at, dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _cell(name: str, value: Any) -> str:
    if value is None:
        return ""
    if name in _TIME_FIELDS:
        return iso(value)
    if isinstance(value, float):
        return f"{value:.6f}".rstrip("0").rstrip(".") if value == value else ""
    return str(value)


def table_csv(columns: Sequence[str], rows: Iterable[Any]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_cell(c, getattr(row, c)) for c in columns])
    return out.getvalue()


def _html_table(columns: Sequence[str], rows: Sequence[Any]) -> str:
    if not rows:
        return "<p><em>none in this window</em></p>"
    head = "".join(f"<th>{escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{escape(_cell(c, getattr(r, c)))}</td>" for c in columns) + "</tr>" for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _by_type(rows: Iterable[CapacityRow]) -> dict[str, list[CapacityRow]]:
    out: dict[str, list[CapacityRow]] = {}
    for row in rows:
        out.setdefault(row.gpu_type, []).append(row)
    return out


def _allocation_chart(gpu_type: str, rows: Sequence[CapacityRow]) -> str:
    def gpus(row: CapacityRow, hours: float) -> tuple[float, float]:
        return (row.bucket_start, hours / ((row.bucket_end - row.bucket_start) / 3600.0))

    return line_chart(
        f"{gpu_type}: GPUs allocated and waiting vs capacity (average per bucket)",
        "GPUs",
        [
            Series("capacity", [gpus(r, r.capacity_gpu_hours) for r in rows], color="#444"),
            Series("allocated", [gpus(r, r.allocated_gpu_hours) for r in rows]),
            Series("pending", [gpus(r, r.pending_gpu_hours) for r in rows], dashed=True),
        ],
    )


def _demand_chart(report: CapacityReport, gpu_type: str, daily: Sequence[CapacityRow]) -> str:
    forecast = [f for f in report.forecast if f.gpu_type == gpu_type]
    history = [r for r in daily if r.bucket_end <= report.now]
    capacity = [(r.bucket_start, r.capacity_gpu_hours) for r in daily] + [
        (f.day_start, f.capacity_gpu_hours) for f in forecast
    ]
    return line_chart(
        f"{gpu_type}: daily demand (allocated + pending) and trend forecast",
        "GPU-hours per day",
        [
            Series("capacity", sorted(capacity), color="#444"),
            Series("demand", [(r.bucket_start, r.demand_gpu_hours) for r in history]),
            Series("forecast", [(f.day_start, f.demand_gpu_hours) for f in forecast], dashed=True),
        ],
    )


_STYLE = (
    "body{font-family:sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse;margin:1em 0}"
    "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f3f3f3}"
    "td:first-child{text-align:left}figure{margin:1em 0}"
)


def render_html(report: CapacityReport, capacity_source: str = "") -> str:
    daily_by_type = _by_type(report.daily)
    sections = []
    for gpu_type, rows in _by_type(report.timeline).items():
        sections.append(f"<h3>{escape(gpu_type)}</h3><figure>{_allocation_chart(gpu_type, rows)}</figure>")
        sections.append(f"<figure>{_demand_chart(report, gpu_type, daily_by_type.get(gpu_type, []))}</figure>")
    capacity = ", ".join(f"{t}={n}" for t, n in report.capacity.items()) or "none given"
    bucket = "day" if report.bucket_s == 86_400 else f"{report.bucket_s / 3600:g} h"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Trainyard capacity report {iso(report.start)[:10]} to {iso(report.end - 1)[:10]}</title>
<style>{_STYLE}</style></head><body>
<h1>Capacity report</h1>
<p>Window {iso(report.start)} to {iso(report.end)} (exclusive), as of {iso(report.now)}; buckets of one {bucket}.
Capacity (GPUs): {escape(capacity)}{f" (from {escape(redact(capacity_source))})" if capacity_source else ""}.
All quantities are GPU-hours unless stated; CSV files with every number sit next to this page.</p>
<h2>Allocation, demand and forecast per GPU type</h2>
{"".join(sections) or "<p><em>no usage and no capacity in this window</em></p>"}
<h2>Demand trend</h2>
<p>Method: {escape(report.forecast_method)}.</p>
{_html_table(TREND_COLUMNS, report.trends)}
<h2>Queue wait per tenant (seconds)</h2>
<p>Wait = placed_at - accepted_at (first run) or placed_at - end of the previous run (requeues);
nearest-rank percentiles over placements inside the window.</p>
{_html_table(WAIT_COLUMNS, report.waits)}
<h2>Lost work</h2>
<p>GPU-hours since the last checkpoint of runs ended by preemption or an infrastructure failure.</p>
{_html_table(LOST_COLUMNS, report.lost)}
</body></html>
"""


def report_files(report: CapacityReport, capacity_source: str = "") -> dict[str, str]:
    """File name -> text of every file of the report."""
    return {
        "capacity.html": render_html(report, capacity_source),
        "capacity.csv": table_csv(CAPACITY_COLUMNS, report.timeline),
        "queue_wait.csv": table_csv(WAIT_COLUMNS, report.waits),
        "lost_work.csv": table_csv(LOST_COLUMNS, report.lost),
        "trend.csv": table_csv(TREND_COLUMNS, report.trends),
        "forecast.csv": table_csv(FORECAST_COLUMNS, report.forecast),
    }
