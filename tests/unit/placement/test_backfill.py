"""Reservations for blocked gangs and EASY backfill around them."""

from __future__ import annotations

import pytest
from placement_builders import busy, holding, job, nodes, placed_nodes, request, snapshot

from trainyard.core.placement import PlacementPolicy, place
from trainyard.core.reasons import PendingReason

NOW = 1_000.0


def rack_half_busy(extra_free: int = 0):
    """Rack r1: two free nodes and two held until NOW + 100; ``extra_free`` free nodes in rack r2."""
    free = nodes(2, rack="r1", name="free-")
    held = busy(nodes(2, rack="r1", name="held-"))
    running = [holding("old", {"held-00": list(range(8)), "held-01": list(range(8))}, NOW - 50, 150)]
    return snapshot(free, held, nodes(extra_free, rack="r2", name="extra-"), running=running)


def test_blocked_gang_gets_a_reservation_when_the_running_job_ends():
    snap = rack_half_busy()
    result = place(snap, [request(job(replicas=4, level="rack"), "big")], NOW)
    (res,) = result.reservations
    assert res.job_id == "big"
    assert res.start_at == NOW + 100
    assert sorted(r.node_id for r in res.replicas) == ["free-00", "free-01", "held-00", "held-01"]
    (waiting,) = result.unplaced
    assert waiting.reason is PendingReason.INSUFFICIENT_GPUS
    assert waiting.expected_start == NOW + 100


@pytest.mark.parametrize(
    "max_runtime_s, extra_free, outcome",
    [
        pytest.param(60, 0, "placed", id="a short job that ends before the reservation backfills onto reserved GPUs"),
        pytest.param(
            600,
            0,
            PendingReason.RESERVED_FOR_LARGER_JOB,
            id="a long job may not take GPUs reserved for the waiting gang",
        ),
        pytest.param(600, 1, "placed", id="a long job runs on a node the reservation does not need"),
    ],
)
def test_later_jobs_backfill_only_without_delaying_the_reservation(max_runtime_s, extra_free, outcome):
    snap = rack_half_busy(extra_free)
    reqs = [
        request(job(replicas=4, level="rack"), "big", 0),
        request(job(replicas=1, max_runtime_s=max_runtime_s), "small", 1),
    ]
    result = place(snap, reqs, NOW)
    (res,) = result.reservations
    if outcome == "placed":
        (p,) = result.placements
        assert p.job_id == "small" and p.backfilled
        if max_runtime_s > 100:
            assert not set(placed_nodes(result, "small")) & {r.node_id for r in res.replicas}
    else:
        assert [(u.job_id, u.reason) for u in result.unplaced] == [
            ("big", PendingReason.INSUFFICIENT_GPUS),
            ("small", outcome),
        ]


def test_without_backfill_later_jobs_take_any_free_gpus():
    snap = rack_half_busy()
    snap = snap.__class__(snap.nodes, snap.running, PlacementPolicy(backfill=False))
    reqs = [request(job(replicas=4), "big", 0), request(job(replicas=1, max_runtime_s=600), "small", 1)]
    result = place(snap, reqs, NOW)
    assert result.reservations == []
    assert [p.job_id for p in result.placements] == ["small"]


def test_gang_that_can_never_fit_gets_no_reservation():
    snap = rack_half_busy(extra_free=2)
    result = place(snap, [request(job(replicas=5, level="rack"), "huge")], NOW)
    assert result.reservations == []
    assert result.unplaced[0].reason is PendingReason.GANG_LARGER_THAN_DOMAIN


def test_small_gangs_below_the_threshold_get_no_reservation():
    snap = rack_half_busy()
    snap = snap.__class__(snap.nodes, snap.running, PlacementPolicy(reserve_min_gpus=64))
    result = place(snap, [request(job(replicas=4), "big")], NOW)
    assert result.reservations == []


def test_reservation_uses_the_earliest_end_that_makes_room():
    free = nodes(1, rack="r1", name="free-")
    held = busy(nodes(3, rack="r1", name="held-"))
    running = [
        holding("a", {"held-00": list(range(8))}, NOW, 300),
        holding("b", {"held-01": list(range(8))}, NOW, 100),
        holding("c", {"held-02": list(range(8))}, NOW, 200),
    ]
    snap = snapshot(free, held, running=running)
    result = place(snap, [request(job(replicas=3), "big")], NOW)
    (res,) = result.reservations
    assert res.start_at == NOW + 200
    assert "held-00" not in {r.node_id for r in res.replicas}


def test_second_reservation_never_uses_the_first_ones_gpus():
    free = nodes(2, rack="r1", name="free-")
    held = busy(nodes(2, rack="r1", name="held-"))
    running = [holding("a", {"held-00": list(range(8))}, NOW, 100), holding("b", {"held-01": list(range(8))}, NOW, 200)]
    snap = snapshot(free, held, running=running, policy=PlacementPolicy(max_reservations=2))
    reqs = [request(job(replicas=3), "first", 0), request(job(replicas=3), "second", 1)]
    result = place(snap, reqs, NOW)
    first, *rest = result.reservations
    assert first.job_id == "first" and first.start_at == NOW + 100
    for later in rest:
        assert not {(r.node_id, g) for r in first.replicas for g in r.gpus} & {
            (r.node_id, g) for r in later.replicas for g in r.gpus
        }


def test_gangs_placed_earlier_in_the_cycle_count_toward_the_reservation():
    snap = snapshot(nodes(2, rack="r1", name="free-"))
    reqs = [request(job(replicas=1, max_runtime_s=100), "first", 0), request(job(replicas=2), "big", 1)]
    result = place(snap, reqs, NOW)
    assert [p.job_id for p in result.placements] == ["first"]
    (res,) = result.reservations
    assert res.start_at == NOW + 100
