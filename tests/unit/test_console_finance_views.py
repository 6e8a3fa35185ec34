"""The console's finance pages, as logic: usage drawn as stacked bars per day
and tenant from the daily totals (a bar per day, never a slope across days),
and capacity rows dated and starting when the cluster began."""

from __future__ import annotations

import datetime as dt

from trainyard.ledger.records import LedgerJob, LedgerRun
from trainyard.reports import capacity_report
from trainyard_gateway.console.bars import nice_ceiling, stacked_bars
from trainyard_gateway.console.finance import DAY_S, cluster_start, day_of, from_start, report_start, usage_series
from trainyard_gateway.console.palette import COLOURS, Palette

DEC_1 = dt.datetime(2026, 12, 1, tzinfo=dt.UTC).timestamp()
DEC_6, DEC_7 = DEC_1 + 5 * DAY_S, DEC_1 + 6 * DAY_S
DAY_7_END = DEC_7 + DAY_S


def run(tenant: str, start: float, end: float | None, gpus: int = 8, run_id: str = "r1") -> LedgerRun:
    return LedgerRun(
        run_id=run_id,
        job_id=f"job-{run_id}",
        tenant=tenant,
        queue="default",
        priority_class=None,
        name=None,
        labels={},
        attempt=1,
        cluster="c1",
        gpus=gpus,
        gpu_type="H100",
        gpus_by_type={"H100": gpus},
        placed_at=start,
        started_at=start,
        ended_at=end,
        outcome=None if end is None else "succeeded",
        gpu_seconds=None,
        lost_seconds=None,
        idle_seconds=None,
    )


def job(accepted_at: float) -> LedgerJob:
    return LedgerJob(
        job_id="j1",
        tenant="acme",
        queue="default",
        name=None,
        gpus_by_type={"H100": 8},
        submitted_at=accepted_at,
        accepted_at=accepted_at,
        cancelled_at=None,
    )


def test_ten_minutes_of_use_today_is_a_bar_today_only() -> None:
    runs = [run("acme", DEC_7 + 3600, DEC_7 + 4200, gpus=6)]  # 6 GPUs for 10 minutes on the 7th
    data = usage_series(runs, "tenant", DEC_6, DEC_7 + DAY_S, DAY_S, now=DEC_7 + 7200)

    chart = stacked_bars(data["x"], data["series"], Palette(["acme"]), DAY_S)

    assert data["series"] == {"acme": [0.0, 1.0]}
    assert [(b["bucket"], b["value"]) for b in chart["bars"]] == [("Dec 07", 1.0)], "nothing drawn on the 6th"
    assert [x["label"] for x in chart["x_labels"]] == ["Dec 06", "Dec 07"]


def test_tenants_stack_in_palette_order_and_heights_add_up_to_the_days_total() -> None:
    runs = [
        run("beta", DEC_6, DEC_6 + 3 * 3600, gpus=2, run_id="r1"),  # 6 GPU-h on the 6th
        run("acme", DEC_6, DEC_6 + 3600, gpus=4, run_id="r2"),  # 4 GPU-h on the 6th
        run("acme", DEC_7 - 3600, DEC_7 + 3600, gpus=1, run_id="r3"),  # 1 GPU-h each side of midnight
    ]
    data = usage_series(runs, "tenant", DEC_6, DEC_7 + DAY_S, DAY_S, now=DEC_7 + DAY_S)

    chart = stacked_bars(data["x"], data["series"], Palette(["acme", "beta"]), DAY_S)
    day6 = [b for b in chart["bars"] if b["bucket"] == "Dec 06"]

    assert chart["totals"] == [11.0, 1.0]
    assert [b["key"] for b in day6] == ["acme", "beta"] and [b["colour"] for b in day6] == list(COLOURS[:2])
    assert day6[1]["y"] + day6[1]["h"] == day6[0]["y"], "beta sits on top of acme"
    full = chart["bottom"] - chart["y_ticks"][-1]["y"]  # the plot's height, up to the top tick (20 GPU-h)
    assert abs(sum(b["h"] for b in day6) - 11.0 / 20.0 * full) < 0.05
    assert chart["y_ticks"][-1]["label"] == "20"


def test_the_axis_tops_at_a_round_number() -> None:
    assert [nice_ceiling(v) for v in (0, 0.3, 1, 11, 26, 999)] == [1.0, 0.5, 1, 20, 50, 1000]


def test_a_cluster_started_today_reports_from_today_not_the_first_of_the_month() -> None:
    registered_at = DEC_7 + 9 * 3600
    began = cluster_start([registered_at, None], [job(DEC_7 + 10 * 3600)], [run("acme", DEC_7 + 11 * 3600, None)])

    start = report_start(DEC_1, DAY_7_END, began)
    report = capacity_report([], [], {"H100": 128}, start, DAY_7_END, DEC_7 + 12 * 3600)
    rows = from_start(report.daily, began)

    assert began == registered_at and start == DEC_7
    assert [day_of(r.bucket_start) for r in rows] == ["2026-12-07"]
    assert rows[0].capacity_gpu_hours == 128 * 15, "counted from 09:00, when the first node registered"
    assert report.daily[0].capacity_gpu_hours == 128 * 24 and from_start(report.daily, DEC_1) == report.daily


def test_the_earliest_record_sets_the_start_and_a_window_after_it_is_kept() -> None:
    began = cluster_start([DEC_7], [job(DEC_1 + 100.0)], [])  # nodes re-registered today; jobs since the 1st

    assert began == DEC_1 + 100.0 and report_start(DEC_1, DEC_7, began) == DEC_1
    assert report_start(DEC_6, DEC_7, DEC_1) == DEC_6, "a window after the start is kept as asked"
    assert cluster_start([], [], []) is None and report_start(DEC_6, DEC_7, None) == DEC_6
    assert report_start(DEC_1, DEC_6, DEC_7) >= DEC_6, "a cluster that began after the window has no days in it"
