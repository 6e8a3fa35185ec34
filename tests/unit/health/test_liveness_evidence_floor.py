"""The evidence floor: silence counts only from the judge's first read and
from the first heartbeat after a fleet-wide gap (a restart of the bus or of
the nodes' host), never across it."""

from __future__ import annotations

import pytest

from trainyard.core.health.liveness import HeartbeatView, NodeWatch, evidence_floor, judge_liveness

GAP = 2.5


@pytest.mark.parametrize(
    ("floor", "previous", "beats", "expected"),
    [
        pytest.param(None, None, [], None, id="nothing read yet: no floor"),
        pytest.param(
            None, None, [10.0, 12.0], 12.0, id="a judge's first read starts the floor at its newest heartbeat"
        ),
        pytest.param(12.0, 12.0, [12.5, 13.0], 12.0, id="heartbeats that keep coming leave the floor where it is"),
        pytest.param(12.0, 13.0, [13.0, 10.0], 12.0, id="no new heartbeat (a silent fleet) leaves the floor"),
        pytest.param(
            12.0, 13.0, [20.0, 13.0, 13.0], 20.0, id="the first heartbeat after a fleet-wide gap moves the floor to it"
        ),
        pytest.param(12.0, 13.0, [20.0, 14.0], 12.0, id="one node still beating in the gap: no fleet-wide gap"),
        pytest.param(30.0, 13.0, [20.0], 30.0, id="the floor never moves back"),
    ],
)
def test_the_evidence_floor(
    floor: float | None, previous: float | None, beats: list[float], expected: float | None
) -> None:
    assert evidence_floor(floor, previous, beats, GAP) == expected


def test_nodes_returning_after_a_fleet_wide_gap_are_not_lost_while_the_first_one_is_back() -> None:
    # Every node silent since 10 (a stalled host, then the bus restarting); n0 is back at 20.
    floor = evidence_floor(10.0, 10.0, [20.0, 10.0, 10.0], GAP)
    watches = [
        NodeWatch(node_id="n0", state="healthy", boot_id="b1", last_heartbeat_at=20.0, watched_since=0.0),
        NodeWatch(
            node_id="n1", state="healthy", boot_id="b1", last_heartbeat_at=10.0, watched_since=max(0.0, floor or 0.0)
        ),
    ]
    verdict = judge_liveness(watches, HeartbeatView(caught_up=True, newest_at=20.0, now=20.1), timeout_s=5.0)
    assert verdict.judged and verdict.lost == ()
    unfloored = [
        w
        if w.node_id == "n0"
        else NodeWatch(node_id="n1", state="healthy", boot_id="b1", last_heartbeat_at=10.0, watched_since=0.0)
        for w in watches
    ]
    assert [
        n.node_id for n in judge_liveness(unfloored, HeartbeatView(caught_up=True, newest_at=20.0, now=20.1), 5.0).lost
    ] == ["n1"]


def test_nobody_is_judged_while_the_node_projection_catches_up() -> None:
    watch = NodeWatch(node_id="n1", state="healthy", boot_id="b2", last_heartbeat_at=None, watched_since=0.0)
    view = HeartbeatView(caught_up=True, newest_at=20.0, now=20.0, roster_caught_up=False)
    verdict = judge_liveness([watch], view, timeout_s=5.0)
    assert not verdict.judged and verdict.reason == "node projection catching up"
