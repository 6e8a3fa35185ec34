"""The evidence floor: silence counts only from the judge's first read and
from the first heartbeat after an interruption (the whole fleet silent, the
bus reconnected), never across one; without an interruption, every silence
counts in full, however seldom the judge reads."""

from __future__ import annotations

import pytest

from trainyard.core.health.liveness import HeartbeatView, NodeWatch, evidence_floor, fleet_interrupted, judge_liveness

GAP = 2.5


@pytest.mark.parametrize(
    ("floor", "previous", "beats", "interrupted", "expected"),
    [
        pytest.param(None, None, [], False, None, id="nothing read yet: no floor"),
        pytest.param(
            None, None, [10.0, 12.0], False, 12.0, id="a judge's first read starts the floor at its newest heartbeat"
        ),
        pytest.param(
            12.0, 12.0, [12.5, 13.0], False, 12.0, id="heartbeats that keep coming leave the floor where it is"
        ),
        pytest.param(
            12.0,
            13.0,
            [40.0, 13.0],
            False,
            12.0,
            id="a judge that read nothing for long (stalled) still counts every silence in full",
        ),
        pytest.param(
            12.0, 13.0, [13.0, 10.0], True, 12.0, id="an interruption with no heartbeat since leaves the floor"
        ),
        pytest.param(
            12.0,
            13.0,
            [21.0, 20.0, 13.0],
            True,
            20.0,
            id="the first heartbeat after an interruption moves the floor to it",
        ),
        pytest.param(30.0, 13.0, [20.0], True, 30.0, id="the floor never moves back"),
    ],
)
def test_the_evidence_floor(
    floor: float | None, previous: float | None, beats: list[float], interrupted: bool, expected: float | None
) -> None:
    assert evidence_floor(floor, previous, beats, interrupted) == expected


@pytest.mark.parametrize(
    ("view", "expected"),
    [
        pytest.param(HeartbeatView(caught_up=True, newest_at=10.0, now=13.0), True, id="the fleet silent past the gap"),
        pytest.param(HeartbeatView(caught_up=True, newest_at=10.0, now=11.0), False, id="a heartbeat within the gap"),
        pytest.param(HeartbeatView(caught_up=False, newest_at=10.0, now=13.0), False, id="a view behind says nothing"),
    ],
)
def test_a_fleet_silent_past_the_gap_is_an_interruption(view: HeartbeatView, expected: bool) -> None:
    assert fleet_interrupted(view, GAP) is expected


def watch(node: str, last: float, since: float = 0.0) -> NodeWatch:
    return NodeWatch(node_id=node, state="healthy", boot_id="b1", last_heartbeat_at=last, watched_since=since)


def test_nodes_returning_after_an_interruption_are_not_lost_while_the_first_one_is_back() -> None:
    # Every node silent since 10 (a stalled host, then the bus restarting); n0 is back at 20.
    floor = evidence_floor(10.0, 10.0, [20.0, 10.0, 10.0], interrupted=True)
    assert floor == 20.0
    view = HeartbeatView(caught_up=True, newest_at=20.0, now=20.1)
    verdict = judge_liveness([watch("n0", 20.0), watch("n1", 10.0, since=floor)], view, timeout_s=5.0)
    assert verdict.judged and verdict.lost == ()
    unfloored = judge_liveness([watch("n0", 20.0), watch("n1", 10.0)], view, timeout_s=5.0)
    assert [n.node_id for n in unfloored.lost] == ["n1"]


def test_nobody_is_judged_while_the_node_projection_catches_up() -> None:
    view = HeartbeatView(caught_up=True, newest_at=20.0, now=20.0, roster_caught_up=False)
    verdict = judge_liveness([watch("n1", 1.0)], view, timeout_s=5.0)
    assert not verdict.judged and verdict.reason == "node projection catching up"
