"""Topology-aware preemption: free one domain at the least lost work."""

from __future__ import annotations

import pytest
from placement_builders import busy, holding, job, nodes, request, snapshot

from trainyard.core.placement import select_victims

NOW = 10_000.0


def rack_of_runs(rack: str, count: int, checkpoint_age: float, preemptible: bool = True):
    """``count`` busy nodes in ``rack``, each held by its own run last checkpointed ``checkpoint_age`` ago."""
    views = busy(nodes(count, rack=rack, name=f"{rack}-n"))
    runs = [
        holding(
            f"{rack}-job{i}", {v.info.node_id: list(range(8))}, NOW - 5_000, 86_400, preemptible, NOW - checkpoint_age
        )
        for i, v in enumerate(views)
    ]
    return views, runs


@pytest.mark.parametrize(
    "racks, spec, expected_victim_rack",
    [
        pytest.param(
            [("r1", 4, 100.0), ("r2", 4, 10.0)],
            job(replicas=4, level="rack"),
            "r2",
            id="the rack whose runs checkpointed most recently is freed",
        ),
        pytest.param(
            [("r1", 2, 1.0), ("r2", 2, 1.0), ("r3", 4, 50.0)],
            job(replicas=4, level="rack"),
            "r3",
            id="victims come from one rack even when cheaper runs are scattered over two racks",
        ),
    ],
)
def test_victims_free_one_domain_at_least_lost_work(racks, spec, expected_victim_rack):
    views, runs = [], []
    for rack, count, age in racks:
        v, r = rack_of_runs(rack, count, age)
        views += v
        runs += r
    snap = snapshot(views, running=runs)
    chosen = select_victims(snap, request(spec), runs, NOW)
    assert chosen is not None
    assert chosen.level == "rack"
    assert {v.split("-")[0] for v in chosen.victims} == {expected_victim_rack}
    assert len(chosen.victims) == 4
    assert chosen.lost_gpu_seconds == pytest.approx(
        sum(r.lost_gpu_seconds(NOW) for r in runs if r.run_id in chosen.victims)
    )
    assert {r.node_id.split("-")[0] for r in chosen.replicas} == {expected_victim_rack}


def test_no_victims_when_the_gang_fits_already():
    views, runs = rack_of_runs("r1", 2, 10.0)
    snap = snapshot(views, nodes(2, rack="r2"), running=runs)
    chosen = select_victims(snap, request(job(replicas=2)), runs, NOW)
    assert chosen is not None and chosen.victims == []


def test_none_when_stopping_every_candidate_is_not_enough():
    views, runs = rack_of_runs("r1", 4, 10.0)
    protected = [r for r in runs if r.job_id.endswith("0")]
    candidates = [r for r in runs if r not in protected]
    snap = snapshot(views, running=runs)
    assert select_victims(snap, request(job(replicas=4, level="rack")), candidates, NOW) is None


def test_only_the_runs_the_gang_needs_are_stopped():
    views, runs = rack_of_runs("r1", 4, 10.0)
    snap = snapshot(views, nodes(2, rack="r1", name="r1-free"), running=runs)
    chosen = select_victims(snap, request(job(replicas=4, level="rack")), runs, NOW)
    assert chosen is not None and len(chosen.victims) == 2


def test_partly_used_node_is_freed_by_its_cheapest_run():
    views = busy(nodes(1, rack="r1", name="shared-"))
    runs = [
        holding("small-a", {"shared-00": [0, 1, 2, 3]}, NOW - 100, 86_400, True, NOW - 100),
        holding("small-b", {"shared-00": [4, 5, 6, 7]}, NOW - 900, 86_400, True, NOW - 900),
    ]
    snap = snapshot(views, running=runs)
    chosen = select_victims(snap, request(job(replicas=1, gpus=4)), runs, NOW)
    assert chosen is not None
    assert chosen.victims == ["small-a-run1"]
    assert chosen.level == "node"
