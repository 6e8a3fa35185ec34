"""Pending intervals and queue-wait percentiles from accepted and placed times."""

from __future__ import annotations

import pytest
from reports_builders import DAY, T0, at, job, run

from trainyard.reports.queue_wait import pending_spans, percentile, wait_stats


@pytest.mark.parametrize(
    ("values", "p", "expected"),
    [
        pytest.param([1.0, 2.0, 3.0, 4.0], 50, 2.0, id="median of four is the second value by nearest rank"),
        pytest.param([1.0, 2.0, 3.0, 4.0], 90, 4.0, id="p90 of four is the largest"),
        pytest.param([float(i) for i in range(1, 101)], 99, 99.0, id="p99 of a hundred is the 99th"),
        pytest.param([5.0], 1, 5.0, id="any percentile of one value is that value"),
        pytest.param([], 50, None, id="no values have no percentile"),
    ],
)
def test_percentile(values, p, expected):
    assert percentile(values, p) == expected


@pytest.mark.parametrize(
    ("jobs", "runs", "now", "expected"),
    [
        pytest.param(
            [job(accepted=0)],
            [run(placed=2, ended=3)],
            at(10),
            [(at(0), at(2), "placed")],
            id="a job waits from acceptance to its first placement",
        ),
        pytest.param(
            [job(accepted=0)],
            [run("r1", placed=1, ended=3, outcome="failed:preempted"), run("r2", placed=5, ended=6)],
            at(10),
            [(at(0), at(1), "placed"), (at(3), at(5), "placed")],
            id="a preempted job waits again from the end of its run to the next placement",
        ),
        pytest.param(
            [job(accepted=4)], [], at(10), [(at(4), at(10), "waiting")], id="a job never placed is still waiting at now"
        ),
        pytest.param(
            [job(accepted=4, cancelled=6)],
            [],
            at(10),
            [(at(4), at(6), "cancelled")],
            id="a job cancelled in the queue waited until the cancel",
        ),
        pytest.param(
            [job(accepted=0)],
            [run(placed=2, ended=None)],
            at(10),
            [(at(0), at(2), "placed")],
            id="an open run ends the wait at its placement",
        ),
    ],
)
def test_pending_spans(jobs, runs, now, expected):
    spans = pending_spans(jobs, runs, now)

    assert [(s.since, s.until, s.ended_by) for s in spans] == expected


def test_wait_stats_per_tenant_counts_placements_in_the_window_and_jobs_still_waiting():
    jobs = [
        job("a1", "acme", accepted=0),
        job("a2", "acme", accepted=0),
        job("a3", "acme", accepted=0),
        job("g1", "globex", accepted=1),
        job("g2", "globex", accepted=20),
        job("g3", "globex", accepted=30),
    ]
    runs = [
        run("ra1", "a1", "acme", placed=1),
        run("ra2", "a2", "acme", placed=2),
        run("ra3", "a3", "acme", placed=4),
        run("rg1", "g1", "globex", placed=1.5),
    ]

    stats = {s.tenant: s for s in wait_stats(pending_spans(jobs, runs, at(40)), T0, T0 + DAY)}

    acme, globex = stats["acme"], stats["globex"]
    assert (acme.placements, acme.p50_s, acme.p90_s, acme.max_s, acme.still_waiting) == (3, 7200.0, 14400.0, 14400.0, 0)
    assert acme.mean_s == pytest.approx(7 * 3600 / 3)
    assert (globex.placements, globex.p50_s, globex.still_waiting) == (1, 1800.0, 1)
