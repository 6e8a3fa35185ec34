"""The launch latencies read back from JOBS and WORK (bench/launch.py)."""

from __future__ import annotations

import pytest

from trainyard.events import JobPlaced, ReplicaPlacement, RunStarted
from trainyard.events.work import ProcessesStarted, StartRun
from trainyard.testing.launches import latencies, percentile


def placed(run: str, at: float, nodes: list[str]) -> JobPlaced:
    replicas = [ReplicaPlacement(role="w", replica=i, rank=i, node_id=n, gpus=[0]) for i, n in enumerate(nodes)]
    return JobPlaced(at=at, job_id=run[:-3], tenant="acme", run_id=run, cluster="c", replicas=replicas)


def work(kind: type, run: str, node: str, at: float) -> StartRun | ProcessesStarted:
    common = {"at": at, "job_id": run[:-3], "tenant": "acme", "run_id": run, "node_id": node}
    if kind is StartRun:
        return StartRun(**common, attempt=1, cluster="c", processes=[])
    return ProcessesStarted(**common, ranks=[0], pids=[1])


def test_each_node_and_the_gang_are_timed_from_the_runs_placement_and_other_jobs_are_left_out() -> None:
    events = [
        placed("j1-r1", 100.0, ["a", "b"]),
        placed("j2-r1", 200.0, ["a"]),
        RunStarted(at=100.5, job_id="j1", tenant="acme", run_id="j1-r1"),
    ]
    reports = [
        work(StartRun, "j1-r1", "a", 100.01),
        work(StartRun, "j1-r1", "b", 100.02),
        work(ProcessesStarted, "j1-r1", "a", 100.2),
        work(ProcessesStarted, "j1-r1", "b", 100.4),
        work(ProcessesStarted, "j1-r1", "b", 109.0),  # the same report again: the first counts
        work(ProcessesStarted, "j2-r1", "a", 201.0),
    ]
    got = latencies(events, reports, job_ids={"j1"})
    assert got.placed == got.started == 1
    assert sorted(got.to_order) == pytest.approx([0.01, 0.02])
    assert sorted(got.to_node_started) == pytest.approx([0.2, 0.4])
    assert got.to_run_started == pytest.approx([0.5])
    assert got.launches_by_node == {"a": 1, "b": 1}


@pytest.mark.parametrize(
    ("q", "expected"),
    [
        pytest.param(0.5, 50, id="the median of 1..100 is 50"),
        pytest.param(0.99, 99, id="p99 of 1..100 is 99"),
        pytest.param(1.0, 100, id="the maximum"),
    ],
)
def test_percentiles_are_by_nearest_rank(q: float, expected: float) -> None:
    assert percentile([float(v) for v in range(100, 0, -1)], q) == expected
