"""Allocation vs capacity, pending demand, lost work and the forecast of the
capacity report, from ledger records."""

from __future__ import annotations

import re

import pytest
from reports_builders import DAY, HOUR, T0, at, job, run

from trainyard.reports.capacity import (
    capacity_from_nodes,
    capacity_report,
    lost_work,
    parse_capacity,
    timeline,
    window_problem,
)
from trainyard.reports.queue_wait import pending_spans
from trainyard.reports.window import parse_instant


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("H100=128", {"H100": 128}, id="a plain number is GPUs"),
        pytest.param("H100=16x8, A100=4", {"A100": 4, "H100": 128}, id="NxG is nodes times GPUs per node"),
        pytest.param("H100=8,H100=8", {"H100": 16}, id="a type named twice adds up"),
    ],
)
def test_parse_capacity(text, expected):
    assert parse_capacity(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("H100", id="a type without a count"),
        pytest.param("H100=lots", id="a count that is not a number"),
        pytest.param(" , ", id="nothing at all"),
    ],
)
def test_bad_capacity_is_refused_with_an_example(text):
    with pytest.raises(ValueError, match="H100=128"):
        parse_capacity(text)


def test_capacity_from_nodes_sums_gpus_per_type():
    assert capacity_from_nodes([("H100", 8), ("H100", 8), ("A100", 4)]) == {"A100": 4, "H100": 16}


def rows_of(runs, jobs=(), capacity=None, now=T0 + 2 * DAY, bucket=DAY, days=2):
    spans = pending_spans(list(jobs), runs, now)
    rows = timeline(runs, spans, capacity or {"H100": 16}, T0, T0 + days * DAY, now, bucket)
    return [(r.gpu_type, r.capacity_gpu_hours, r.allocated_gpu_hours, r.pending_gpu_hours) for r in rows]


@pytest.mark.parametrize(
    ("runs", "jobs", "now", "expected"),
    [
        pytest.param(
            [run(placed=1, ended=3)],
            [],
            T0 + 2 * DAY,
            [("H100", 384.0, 16.0, 0.0), ("H100", 384.0, 0.0, 0.0)],
            id="an 8-GPU run of two hours allocates 16 GPU-hours on its day",
        ),
        pytest.param(
            [run(placed=22, ended=26)],
            [],
            T0 + 2 * DAY,
            [("H100", 384.0, 16.0, 0.0), ("H100", 384.0, 16.0, 0.0)],
            id="a run across midnight is split between the two days",
        ),
        pytest.param(
            [run(placed=10, started=12, ended=13)],
            [],
            T0 + 2 * DAY,
            [("H100", 384.0, 24.0, 0.0), ("H100", 384.0, 0.0, 0.0)],
            id="GPUs count as allocated from placement, before the run starts",
        ),
        pytest.param(
            [run(placed=20, ended=None)],
            [],
            at(30),
            [("H100", 384.0, 32.0, 0.0), ("H100", 384.0, 48.0, 0.0)],
            id="an open run is allocated up to now",
        ),
        pytest.param(
            [run(placed=4, ended=5)],
            [job(accepted=1)],
            T0 + 2 * DAY,
            [("H100", 384.0, 8.0, 24.0), ("H100", 384.0, 0.0, 0.0)],
            id="a job waiting three hours for 8 GPUs is 24 pending GPU-hours",
        ),
        pytest.param(
            [run(gpu_type="A100", gpus=4, placed=0, ended=1)],
            [],
            T0 + 2 * DAY,
            [("A100", 0.0, 4.0, 0.0), ("H100", 384.0, 0.0, 0.0), ("A100", 0.0, 0.0, 0.0), ("H100", 384.0, 0.0, 0.0)],
            id="usage of a type with no capacity is reported against zero capacity",
        ),
    ],
)
def test_timeline(runs, jobs, now, expected):
    result = rows_of(runs, jobs, now=now)

    assert result == [pytest.approx(e) for e in expected]


def test_hourly_buckets_show_the_hours_a_run_held():
    rows = rows_of([run(gpus=8, placed=1.5, ended=3)], capacity={"H100": 8}, bucket=HOUR, days=1)

    assert [r[2] for r in rows[:4]] == pytest.approx([0.0, 4.0, 8.0, 0.0])
    assert len(rows) == 24


def test_utilisation_is_allocation_over_capacity():
    report = capacity_report([run(placed=0, ended=12)], [], {"H100": 16}, T0, T0 + DAY, T0 + DAY)

    assert report.timeline[0].utilisation == pytest.approx(96.0 / 384.0)


@pytest.mark.parametrize(
    ("runs", "expected"),
    [
        pytest.param(
            [run(placed=0, ended=2, outcome="failed:preempted", lost_hours=0.5)],
            [("acme", "H100", 1, 1, 16.0, 4.0, 0.25)],
            id="a preempted run loses the GPU-hours since its last checkpoint",
        ),
        pytest.param(
            [run("r1", placed=0, ended=2), run("r2", placed=0, ended=2, outcome="failed:node_failure", lost_hours=2)],
            [("acme", "H100", 2, 1, 32.0, 16.0, 0.5)],
            id="lost share is over every run that ended",
        ),
        pytest.param([run(placed=0, ended=30)], [], id="a run ending after the window is not counted"),
    ],
)
def test_lost_work(runs, expected):
    rows = lost_work(runs, T0, T0 + DAY)

    assert [
        (r.tenant, r.gpu_type, r.runs_ended, r.runs_lost_work, r.gpu_hours, r.lost_gpu_hours, r.lost_share)
        for r in rows
    ] == [pytest.approx(e) for e in expected]


def test_the_forecast_extends_the_daily_demand_trend_past_the_last_complete_day():
    # Demand of 8, 16, 24 GPU-hours on days 1-3: a rise of 8 GPU-hours a day.
    runs = [run(f"r{d}", f"j{d}", placed=24 * d, ended=24 * d + d + 1, gpus=8) for d in range(3)]
    now = T0 + 3 * DAY + 6 * HOUR  # day 4 is not complete: left out of the fit

    report = capacity_report(runs, [], {"H100": 1}, T0, T0 + 4 * DAY, now, horizon_days=3)

    (trend,) = report.trends
    assert (trend.days, trend.slope_gpu_hours_per_day, trend.intercept_gpu_hours) == (
        3,
        pytest.approx(8.0),
        pytest.approx(8.0),
    )
    assert [(f.day_start, f.demand_gpu_hours) for f in report.forecast] == [
        (T0 + 3 * DAY, pytest.approx(32.0)),
        (T0 + 4 * DAY, pytest.approx(40.0)),
        (T0 + 5 * DAY, pytest.approx(48.0)),
    ]
    assert trend.capacity_gpu_hours_per_day == 24.0
    assert trend.first_day_over_capacity == T0 + 3 * DAY


def test_a_window_with_nothing_in_it_still_reports_capacity_and_no_forecast_before_a_day_completes():
    report = capacity_report([], [], {"H100": 8}, T0, T0 + DAY, T0 + HOUR)

    assert [(r.gpu_type, r.capacity_gpu_hours, r.allocated_gpu_hours) for r in report.timeline] == [
        ("H100", 192.0, 0.0)
    ]
    assert report.trends == [] and report.forecast == [] and report.waits == [] and report.lost == []


@pytest.mark.parametrize(
    ("span_days", "bucket_s", "horizon", "says"),
    [
        pytest.param(20_000 / 24, HOUR, 14, None, id="20,000 hour buckets: the most"),
        pytest.param(20_000 / 24 + 1, HOUR, 14, "at most 20,000: shorten it; or use day buckets", id="more hours"),
        pytest.param(20_000, DAY, 0, None, id="20,000 day buckets"),
        pytest.param(20_001, DAY, 0, "holds 20,001 day buckets", id="more days"),
        pytest.param(30, DAY, 366, "horizon must be 0 to 365 days, not 366", id="a forecast past a year"),
        pytest.param(30, DAY, -1, "not -1", id="a negative horizon"),
    ],
)
def test_a_report_too_large_to_build_is_refused_before_it_is_built(span_days, bucket_s, horizon, says):
    start, end = T0, T0 + span_days * DAY
    problem = window_problem(start, end, bucket_s, horizon)
    if says is None:
        assert problem is None
        return
    assert problem is not None and says in problem
    with pytest.raises(ValueError, match=re.escape(says)):
        capacity_report([], [], {"H100": 8}, start, end, end, bucket_s=bucket_s, horizon_days=horizon)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        pytest.param("9999-12-31", "past the last date", id="the day after the last one Python can read"),
        pytest.param("inf", "is not a date", id="infinite seconds"),
        pytest.param("nan", "is not a date", id="not a number"),
        pytest.param("1e400", "is not a date", id="seconds too large for a float"),
    ],
)
def test_window_bounds_past_what_can_be_read_say_so(text, says):
    with pytest.raises(ValueError, match=says):
        parse_instant(text, end_of_day=True)
