import pytest
from health_builders import fatal, finding, record

from trainyard.core.health import (
    DEFAULT_POLICY,
    Alert,
    ChecksFailed,
    ChecksPassed,
    Cordon,
    CordonNode,
    Drain,
    DrainComplete,
    FailRunsOnNode,
    FindingKind,
    HealthPolicy,
    HeartbeatResumed,
    PreemptRunsOnNode,
    RebootNode,
    Remedy,
    ResetGpu,
    Severity,
    TransitionRejected,
    Uncordon,
    UncordonNode,
    transition,
)
from trainyard.domain.node import NodeState as S

OP = "operator:ana"


def run(steps, start=None, policy=DEFAULT_POLICY):
    """Apply (time, input) steps; return the final record and every action."""
    rec = start or record()
    actions = []
    for at, event in steps:
        rec, acts = transition(rec, event, at, policy)
        actions.extend(acts)
    return rec, actions


def types(actions):
    return [type(a).__name__ for a in actions]


@pytest.mark.parametrize(
    "start, event, state, action_types",
    [
        pytest.param(
            S.HEALTHY,
            fatal(kind=FindingKind.GPU_LOST, action=Remedy.DRAIN_NOW),
            S.DRAINING,
            ["CordonNode", "FailRunsOnNode", "Alert"],
            id="a fatal finding cordons a healthy node and fails its runs at once",
        ),
        pytest.param(
            S.SUSPECT,
            fatal(),
            S.DRAINING,
            ["CordonNode", "FailRunsOnNode", "Alert"],
            id="a fatal finding on a suspect node isolates it",
        ),
        pytest.param(
            S.CORDONED,
            fatal(),
            S.DRAINING,
            ["FailRunsOnNode", "Alert"],
            id="a fatal finding on a cordoned node fails its runs without cordoning twice",
        ),
        pytest.param(
            S.HEALTHY, finding(), S.SUSPECT, ["RunHealthChecks"], id="a suspect finding asks for health checks"
        ),
        pytest.param(
            S.HEALTHY,
            finding(severity=Severity.INFO, action=Remedy.RESTART_JOB, gpu=2),
            S.HEALTHY,
            ["FailRunsOnNode"],
            id="an application XID restarts the runs on that GPU and keeps the node",
        ),
        pytest.param(
            S.HEALTHY,
            finding(severity=Severity.INFO, action=Remedy.IGNORE),
            S.HEALTHY,
            [],
            id="an ignorable finding changes nothing",
        ),
        pytest.param(
            S.HEALTHY,
            fatal(kind=FindingKind.HEARTBEAT_TIMEOUT, gpu=None),
            S.LOST,
            ["CordonNode", "FailRunsOnNode", "Alert"],
            id="a heartbeat timeout marks the node lost and fails its runs",
        ),
        pytest.param(
            S.REPAIR,
            fatal(kind=FindingKind.HEARTBEAT_TIMEOUT, gpu=None),
            S.LOST,
            ["Alert"],
            id="a node in repair that stops reporting is lost, with no runs to fail",
        ),
        pytest.param(S.LOST, fatal(), S.LOST, [], id="findings about a lost node wait until it reports again"),
        pytest.param(S.DRAINING, fatal(), S.DRAINING, [], id="a second fatal finding while draining adds nothing"),
        pytest.param(
            S.DRAINING,
            DrainComplete(node_id="n1"),
            S.REPAIR,
            ["RunHealthChecks"],
            id="a drained node goes to repair and is checked",
        ),
        pytest.param(
            S.REPAIR,
            ChecksPassed(node_id="n1"),
            S.HEALTHY,
            ["UncordonNode"],
            id="a repaired node that passes checks is back in service",
        ),
        pytest.param(
            S.SUSPECT, ChecksPassed(node_id="n1"), S.HEALTHY, [], id="a suspect node that passes checks is healthy"
        ),
        pytest.param(
            S.SUSPECT,
            ChecksFailed(node_id="n1", reason="dcgm diag level 2"),
            S.CORDONED,
            ["CordonNode", "Alert"],
            id="a suspect node that fails checks is cordoned",
        ),
        pytest.param(
            S.HEALTHY,
            Cordon(node_id="n1", by=OP, reason="maintenance"),
            S.CORDONED,
            ["CordonNode"],
            id="an operator cordons a healthy node",
        ),
        pytest.param(
            S.CORDONED,
            Drain(node_id="n1", by=OP, reason="maintenance"),
            S.DRAINING,
            ["PreemptRunsOnNode"],
            id="an operator drain of a cordoned node preempts its runs gracefully",
        ),
        pytest.param(
            S.REPAIR,
            Uncordon(node_id="n1", by=OP, reason="swapped GPU 3"),
            S.HEALTHY,
            ["UncordonNode"],
            id="an operator uncordon returns a node from repair",
        ),
        pytest.param(
            S.LOST,
            HeartbeatResumed(node_id="n1"),
            S.REPAIR,
            ["RunHealthChecks"],
            id="a lost node that reports again is checked before it takes work",
        ),
    ],
)
def test_transition(start, event, state, action_types):
    rec, actions = transition(record(state=start), event, 10.0)
    assert rec.state == state
    assert types(actions) == action_types


@pytest.mark.parametrize(
    "start, event, why",
    [
        pytest.param(
            S.HEALTHY, ChecksPassed(node_id="n1"), "healthy", id="passing checks on a healthy node is rejected"
        ),
        pytest.param(
            S.CORDONED, ChecksPassed(node_id="n1"), "cordoned", id="passing checks do not lift an operator's cordon"
        ),
        pytest.param(
            S.REPAIR,
            Uncordon(node_id="n1", by="automation", reason="x"),
            "only an operator",
            id="automation cannot uncordon",
        ),
        pytest.param(
            S.LOST,
            Uncordon(node_id="n1", by=OP, reason="x"),
            "not reporting",
            id="a lost node cannot be uncordoned before it reports",
        ),
        pytest.param(S.HEALTHY, DrainComplete(node_id="n1"), "not draining", id="drain complete without a drain"),
        pytest.param(S.REPAIR, Cordon(node_id="n1", by=OP, reason="x"), "repair", id="cordoning a node in repair"),
        pytest.param(
            S.HEALTHY, HeartbeatResumed(node_id="n1"), "not lost", id="heartbeat resumed on a node never lost"
        ),
        pytest.param(S.HEALTHY, fatal(node="n2"), "n2", id="a finding about another node"),
    ],
)
def test_invalid_transition_changes_nothing_and_says_why(start, event, why):
    before = record(state=start)
    after, actions = transition(before, event, 10.0)
    assert after is before
    [rejected] = actions
    assert isinstance(rejected, TransitionRejected)
    assert why in rejected.reason


def test_full_repair_cycle_resets_the_failed_gpu_then_returns_the_node():
    rec, actions = run(
        [(1, fatal(kind=FindingKind.XID, action=Remedy.RESET_GPU, gpu=5)), (2, DrainComplete(node_id="n1"))]
    )
    assert rec.state == S.REPAIR and rec.remedy == Remedy.RESET_GPU
    assert ResetGpu(node_id="n1", gpu=5) in actions
    assert FailRunsOnNode(node_id="n1", reason="node_failure") in actions
    rec, actions = transition(rec, ChecksPassed(node_id="n1", checks=("dcgm-r2",)), 3)
    assert rec.state == S.HEALTHY and rec.remedy is None and rec.gpus == ()
    assert actions == (UncordonNode(node_id="n1", reason="health checks passed", by="automation"),)
    assert [(h.from_state, h.to_state) for h in rec.history] == [
        (S.HEALTHY, S.DRAINING),
        (S.DRAINING, S.REPAIR),
        (S.REPAIR, S.HEALTHY),
    ]


def test_failed_repair_checks_escalate_from_reset_to_reboot_to_hands_on():
    rec, _ = run([(1, fatal(action=Remedy.RESET_GPU)), (2, DrainComplete(node_id="n1"))])
    rec, actions = transition(rec, ChecksFailed(node_id="n1", reason="still failing"), 3)
    assert rec.state == S.REPAIR and rec.remedy == Remedy.REBOOT_NODE
    assert RebootNode(node_id="n1") in actions
    rec, actions = transition(rec, ChecksFailed(node_id="n1", reason="still failing"), 4)
    assert rec.remedy == Remedy.DRAIN_NOW
    assert types(actions) == ["Alert"] and actions[0].severity == "page"


def test_the_strongest_remedy_of_an_incident_wins():
    rec, _ = run(
        [
            (1, fatal(action=Remedy.RESET_GPU, gpu=1)),
            (2, fatal(action=Remedy.DRAIN_NOW, gpu=4, kind=FindingKind.GPU_LOST)),
            (3, fatal(action=Remedy.RESET_GPU, gpu=1)),
        ]
    )
    assert rec.remedy == Remedy.DRAIN_NOW and rec.gpus == (1, 4)


def test_a_node_flapping_between_suspect_and_healthy_is_cordoned_on_the_third_swing_within_an_hour():
    steps = []
    for k in range(3):
        steps += [(k * 600.0, finding(at=k * 600.0)), (k * 600.0 + 60, ChecksPassed(node_id="n1"))]
    rec, actions = run(steps[:-1])
    assert rec.state == S.CORDONED
    assert any(isinstance(a, CordonNode) and "flapping" in a.reason for a in actions)


def test_suspect_swings_spread_over_more_than_the_window_are_not_flapping():
    steps = []
    for k in range(3):
        steps += [(k * 4000.0, finding(at=k * 4000.0)), (k * 4000.0 + 60, ChecksPassed(node_id="n1"))]
    rec, _ = run(steps[:-1])
    assert rec.state == S.SUSPECT


def test_the_same_suspect_finding_repeated_every_sample_does_not_escalate():
    rec, _ = run([(t, finding(kind=FindingKind.TEMPERATURE, at=t)) for t in range(0, 600, 30)])
    assert rec.state == S.SUSPECT


def test_three_different_suspect_findings_cordon_the_node():
    rec, actions = run(
        [
            (1, finding(kind=FindingKind.TEMPERATURE, gpu=0)),
            (2, finding(kind=FindingKind.NVLINK_ERRORS, gpu=0)),
            (3, finding(kind=FindingKind.TEMPERATURE, gpu=3)),
        ]
    )
    assert rec.state == S.CORDONED and rec.cordoned_by == "automation"
    assert types(actions) == ["RunHealthChecks", "CordonNode", "Alert"]


def cycle(at):
    """One fatal incident followed by a successful repair."""
    return [(at, fatal(at=at)), (at + 10, DrainComplete(node_id="n1")), (at + 20, ChecksPassed(node_id="n1"))]


def test_a_lemon_node_stays_in_repair_after_passing_checks():
    day = 86400.0
    rec, actions = run(cycle(0) + cycle(day) + cycle(2 * day))
    assert rec.state == S.REPAIR and rec.lemon
    assert isinstance(actions[-1], Alert) and "until an operator" in actions[-1].summary
    rec, actions = transition(rec, Uncordon(node_id="n1", by=OP, reason="replaced the board"), 3 * day)
    assert rec.state == S.HEALTHY and not rec.lemon and rec.incidents == ()


def test_incidents_older_than_the_lemon_window_do_not_count():
    week = 7 * 86400.0
    rec, _ = run(cycle(0) + cycle(week + 1) + cycle(2 * week + 2))
    assert rec.state == S.HEALTHY and not rec.lemon


def test_history_is_bounded_and_keeps_the_latest_entries():
    policy = HealthPolicy(history_limit=4, flap_limit=100)
    steps = []
    for k in range(10):
        steps += [(k * 10.0, finding(at=k * 10.0)), (k * 10.0 + 5, ChecksPassed(node_id="n1"))]
    rec, _ = run(steps, policy=policy)
    assert len(rec.history) == 4
    assert rec.history[-1].at == 95.0 and rec.history[-1].to_state == S.HEALTHY


def test_operator_drain_preempts_instead_of_failing_runs():
    rec, actions = transition(record(), Drain(node_id="n1", by=OP, reason="firmware update"), 1)
    assert rec.state == S.DRAINING and rec.incidents == ()
    assert actions == (
        CordonNode(node_id="n1", reason="firmware update", by=OP),
        PreemptRunsOnNode(node_id="n1", reason="firmware update"),
    )


def test_every_accepted_change_bumps_the_version_and_rejections_do_not():
    rec, _ = transition(record(), finding(), 1)
    assert rec.version == 1
    same, actions = transition(rec, DrainComplete(node_id="n1"), 2)
    assert same.version == 1
    assert types(actions) == ["TransitionRejected"]
