"""The liveness rule: silence is judged on a caught-up view, on the heartbeats'
own clock relative to the fleet's newest heartbeat; the boot-id rule; a
withdrawn loss is not an incident."""

from __future__ import annotations

import pytest

from trainyard.core.health import (
    FindingKind,
    HealthPolicy,
    HeartbeatResumed,
    HeartbeatView,
    NodeHealthRecord,
    NodeWatch,
    Remedy,
    Severity,
    heartbeat_counts,
    heartbeat_resumes,
    judge_liveness,
    transition,
)
from trainyard.core.health.findings import Finding
from trainyard.domain.node import NodeState

TIMEOUT = 5.0


def watch(node: str, last: float | None, state: str = "healthy", boot: str = "b1", since: float = 0.0) -> NodeWatch:
    return NodeWatch(node_id=node, state=state, boot_id=boot, last_heartbeat_at=last, watched_since=since)


@pytest.mark.parametrize(
    "nodes, view, lost",
    [
        pytest.param(
            [watch("n0", 100.0), watch("n1", 100.0)],
            HeartbeatView(caught_up=True, newest_at=100.0, now=100.5),
            [],
            id="every node heard from just now: nobody is lost",
        ),
        pytest.param(
            [watch("n0", 100.0), watch("n1", 90.0)],
            HeartbeatView(caught_up=True, newest_at=100.0, now=100.5),
            ["n1"],
            id="a node 10 s behind the fleet's newest heartbeat is lost",
        ),
        pytest.param(
            [watch("n0", 100.0), watch("n1", 90.0)],
            HeartbeatView(caught_up=False, newest_at=100.0, now=100.5),
            [],
            id="a view that has not read the backlog judges nobody",
        ),
        pytest.param(
            [watch("n0", 110.0), watch("n1", 110.0)],
            HeartbeatView(caught_up=True, newest_at=110.0, now=111.0),
            [],
            id="after a 10 s stall of the judge, the backlog it read keeps every node alive",
        ),
        pytest.param(
            [watch("n0", 100.0), watch("n1", 99.0)],
            HeartbeatView(caught_up=True, newest_at=100.0, now=100.0 + 3 * TIMEOUT),
            [],
            id="the whole fleet silent by the judge's clock: nobody is lost (the path to the fleet is at fault)",
        ),
        pytest.param(
            [watch("n0", 100.0), watch("n1", 93.0)],
            HeartbeatView(caught_up=True, newest_at=200.0, now=100.0),
            ["n1"],
            id="the reference never runs ahead of the judge's clock",
        ),
        pytest.param(
            [watch("n0", 100.0), watch("n1", None, since=98.0)],
            HeartbeatView(caught_up=True, newest_at=100.0, now=100.0),
            [],
            id="a boot never heard from is watched from its registration",
        ),
        pytest.param(
            [watch("n0", 100.0), watch("n1", None, since=80.0)],
            HeartbeatView(caught_up=True, newest_at=100.0, now=100.0),
            ["n1"],
            id="a boot silent since its registration, longer than the timeout, is lost",
        ),
        pytest.param(
            [watch("n0", 100.0), watch("n1", 50.0, state="lost"), watch("n2", 50.0, state="registering")],
            HeartbeatView(caught_up=True, newest_at=100.0, now=100.0),
            [],
            id="lost and registering nodes are not judged again",
        ),
        pytest.param(
            [watch("n0", 100.0), watch("n1", 50.0, state="cordoned"), watch("n2", 50.0, state="draining")],
            HeartbeatView(caught_up=True, newest_at=100.0, now=100.0),
            ["n1", "n2"],
            id="cordoned and draining nodes that go silent are lost too",
        ),
        pytest.param(
            [watch("n0", 100.0)],
            HeartbeatView(caught_up=True, newest_at=None, now=100.0),
            [],
            id="no heartbeat read yet: nobody is judged",
        ),
    ],
)
def test_judge_liveness(nodes, view, lost) -> None:
    verdict = judge_liveness(nodes, view, TIMEOUT)
    assert [s.node_id for s in verdict.lost] == lost
    assert verdict.judged == (view.caught_up and view.newest_at is not None and view.now - view.newest_at <= TIMEOUT)


def test_a_silent_fleet_is_reported_as_such() -> None:
    verdict = judge_liveness([watch("n0", 100.0)], HeartbeatView(caught_up=True, newest_at=100.0, now=130.0), TIMEOUT)
    assert not verdict.judged and verdict.fleet_silent_for_s == 30.0


@pytest.mark.parametrize(
    "state, registered, boot, advanced, counts, resumes",
    [
        pytest.param(
            "lost", "b2", "b2", True, True, True, id="the registered boot heartbeats again after a loss: it comes back"
        ),
        pytest.param(
            "lost", "b2", "b1", True, False, False, id="an older boot's heartbeat neither counts nor brings it back"
        ),
        pytest.param(
            "lost", "b2", "b2", False, True, False, id="a heartbeat no newer than the last one read brings nothing back"
        ),
        pytest.param("healthy", "b2", "b2", True, True, False, id="a healthy node has nothing to come back from"),
        pytest.param("lost", None, "b1", True, False, False, id="an unregistered node's heartbeat does not count"),
    ],
)
def test_the_boot_id_rule(state, registered, boot, advanced, counts, resumes) -> None:
    assert heartbeat_counts(registered, boot) == counts
    assert heartbeat_resumes(state, registered, boot, advanced) == resumes


def _lost(record: NodeHealthRecord, at: float, policy: HealthPolicy) -> NodeHealthRecord:
    finding = Finding(
        node_id=record.node_id,
        gpu=None,
        kind=FindingKind.HEARTBEAT_TIMEOUT,
        severity=Severity.FATAL,
        action=Remedy.REBOOT_NODE,
        message="no heartbeat",
        at=at,
    )
    lost, _ = transition(record, finding, at, policy)
    assert lost.state == NodeState.LOST
    return lost


@pytest.mark.parametrize(
    "same_boot, incidents, lemon",
    [
        pytest.param(True, 0, False, id="a loss withdrawn because the same boot heartbeats again is not an incident"),
        pytest.param(False, 3, True, id="a loss ended by a new boot (a real restart) counts toward the lemon rule"),
    ],
)
def test_false_losses_do_not_make_a_lemon(same_boot, incidents, lemon) -> None:
    policy = HealthPolicy(lemon_incidents=3)
    record = NodeHealthRecord(node_id="n1")
    for i in range(3):
        record = _lost(record, 100.0 * (i + 1), policy)
        record, actions = transition(
            record, HeartbeatResumed(node_id="n1", same_boot=same_boot), 100.0 * (i + 1) + 1, policy
        )
        assert record.state == NodeState.REPAIR and actions
        record = msgspec_replace(record, state=NodeState.HEALTHY)  # checks passed
    assert len(record.incidents) == incidents and record.lemon == lemon


def test_a_withdrawn_loss_keeps_an_earlier_lemon_mark() -> None:
    policy = HealthPolicy(lemon_incidents=1)
    record = msgspec_replace(NodeHealthRecord(node_id="n1"), incidents=(10.0,), lemon=True)
    record = _lost(record, 100.0, policy)
    record, _ = transition(record, HeartbeatResumed(node_id="n1", same_boot=True), 101.0, policy)
    assert record.incidents == (10.0,) and record.lemon


def msgspec_replace(record: NodeHealthRecord, **changes) -> NodeHealthRecord:  # type: ignore[no-untyped-def]
    import msgspec

    return msgspec.structs.replace(record, **changes)
