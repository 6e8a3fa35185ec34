"""Properties of the node state machine and the blast-radius limit over random inputs."""

from health_builders import nodes
from hypothesis import given, settings
from hypothesis import strategies as st

from trainyard.core.health import (
    ChecksFailed,
    ChecksPassed,
    Cordon,
    Decision,
    Drain,
    DrainComplete,
    Finding,
    FindingKind,
    HealthPolicy,
    HeartbeatResumed,
    NodeHealthRecord,
    Remedy,
    Severity,
    TransitionRejected,
    Uncordon,
    limit_blast_radius,
    pool_limit,
    pool_of,
    transition,
)
from trainyard.domain.node import SCHEDULABLE_STATES, NodeState

POLICY = HealthPolicy(history_limit=8, lemon_incidents=2, lemon_window_s=1000.0, flap_limit=3, flap_window_s=500.0)

findings = st.builds(
    Finding,
    node_id=st.just("n1"),
    gpu=st.one_of(st.none(), st.integers(0, 7)),
    kind=st.sampled_from(FindingKind),
    severity=st.sampled_from(Severity),
    action=st.sampled_from(Remedy),
    message=st.just("random finding"),
    at=st.just(0.0),
)
people = st.sampled_from(["operator:ana", "operator:bo", "automation"])
commands = st.one_of(
    st.builds(Cordon, node_id=st.just("n1"), by=people, reason=st.just("r")),
    st.builds(Uncordon, node_id=st.just("n1"), by=people, reason=st.just("r")),
    st.builds(Drain, node_id=st.just("n1"), by=people, reason=st.just("r")),
    st.builds(DrainComplete, node_id=st.just("n1")),
    st.builds(ChecksPassed, node_id=st.just("n1")),
    st.builds(ChecksFailed, node_id=st.just("n1"), reason=st.just("r")),
    st.builds(HeartbeatResumed, node_id=st.just("n1")),
)
inputs = st.lists(st.tuples(st.floats(0, 200, allow_nan=False), st.one_of(findings, commands)), max_size=60)


def replay(steps):
    rec, now = NodeHealthRecord(node_id="n1"), 0.0
    for dt, event in steps:
        now += dt
        before = rec
        rec, actions = transition(rec, event, now, POLICY)
        yield before, event, rec, actions, now


@settings(max_examples=300, deadline=None)
@given(inputs)
def test_random_inputs_never_reach_an_undefined_state(steps):
    for before, _event, after, actions, now in replay(steps):
        assert isinstance(after.state, NodeState)
        assert len(after.history) <= POLICY.history_limit
        assert after.version in (before.version, before.version + 1)
        assert all(now - t < POLICY.lemon_window_s for t in after.incidents) or after.incidents == before.incidents
        rejected = [a for a in actions if isinstance(a, TransitionRejected)]
        if rejected:  # an input that does not apply changes nothing
            assert after is before and len(actions) == 1
        if after.state == NodeState.HEALTHY:
            assert after.remedy is None and after.cordoned_by is None


@settings(max_examples=300, deadline=None)
@given(inputs)
def test_a_node_returns_to_healthy_only_through_passing_checks_or_an_operator_uncordon(steps):
    for before, event, after, _, _ in replay(steps):
        if before.state != NodeState.HEALTHY and after.state == NodeState.HEALTHY:
            assert isinstance(event, ChecksPassed) or (isinstance(event, Uncordon) and event.by.startswith("operator:"))
            assert before.state != NodeState.LOST
            if isinstance(event, ChecksPassed) and before.state == NodeState.REPAIR:
                assert not before.lemon


@settings(max_examples=300, deadline=None)
@given(inputs)
def test_runs_are_failed_whenever_a_fatal_finding_takes_a_node_out_of_service(steps):
    for before, event, after, actions, _ in replay(steps):
        if isinstance(event, Finding) and event.severity == Severity.FATAL and before.state in SCHEDULABLE_STATES:
            assert after.state in (NodeState.DRAINING, NodeState.LOST)
            assert any(type(a).__name__ == "FailRunsOnNode" for a in actions)


# --- blast radius ---------------------------------------------------------------

STATES = list(NodeState)


@st.composite
def fleets(draw):
    pools = draw(st.integers(1, 3))
    fleet = {}
    for p in range(pools):
        fleet.update(nodes(draw(st.integers(1, 25)), rack=f"r{p}", pool=f"p{p}"))
    records = {n: NodeHealthRecord(node_id=n, state=draw(st.sampled_from(STATES))) for n in fleet}
    chosen = draw(st.lists(st.sampled_from(sorted(fleet)), unique=True))
    decisions = [
        Decision(
            before=records[n],
            after=NodeHealthRecord(node_id=n, state=draw(st.sampled_from(STATES)), reason="random"),
            actions=(),
            automated=draw(st.booleans()),
        )
        for n in chosen
    ]
    share = draw(st.sampled_from([0.0, 0.05, 0.1, 0.5]))
    return (
        fleet,
        records,
        decisions,
        HealthPolicy(blast_radius_max_share=share, blast_radius_min_nodes=draw(st.integers(0, 2))),
    )


def out_of_service(fleet, records, decisions, policy):
    after = dict(records)
    after.update({d.node_id: d.after for d in decisions})
    counts = {}
    for n, node in fleet.items():
        pool = pool_of(node, policy)
        counts[pool] = counts.get(pool, 0) + (after[n].state not in SCHEDULABLE_STATES)
    return counts


@settings(max_examples=300, deadline=None)
@given(fleets())
def test_automation_never_takes_a_pool_past_its_blast_radius(case):
    fleet, records, decisions, policy = case
    kept = limit_blast_radius(decisions, records, fleet, policy)
    assert [d.node_id for d in kept] == [d.node_id for d in decisions]
    without_automation = out_of_service(
        fleet, records, [d for d in decisions if not d.automated or not d.takes_out_of_service], policy
    )
    final = out_of_service(fleet, records, kept, policy)
    sizes = {}
    for node in fleet.values():
        sizes[pool_of(node, policy)] = sizes.get(pool_of(node, policy), 0) + 1
    for pool, count in final.items():
        assert count <= max(pool_limit(sizes[pool], policy), without_automation[pool])
    for original, result in zip(decisions, kept, strict=True):
        if not original.automated or not original.takes_out_of_service:
            assert result is original  # operators and recoveries are never held back
        elif result is not original:
            assert result.after is original.before and len(result.actions) == 1
