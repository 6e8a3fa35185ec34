import pytest
from health_builders import fatal, finding, nodes, record

from trainyard.core.health import (
    Alert,
    ChecksPassed,
    Cordon,
    Decision,
    FindingKind,
    HealthPolicy,
    Severity,
    correlate,
    limit_blast_radius,
    pool_limit,
    rack_fault_alert,
    transition,
)
from trainyard.domain.node import NodeState as S

POLICY = HealthPolicy(rack_fault_min_nodes=3, rack_fault_window_s=300.0)


def fleet():
    return {**nodes(8, rack="r1"), **nodes(8, rack="r2")}


@pytest.mark.parametrize(
    "failing, at, racks, kept",
    [
        pytest.param(
            {"r1-n0": 10, "r1-n1": 20, "r1-n2": 30},
            60,
            ["r1"],
            0,
            id="three nodes of one rack failing within five minutes are one rack fault",
        ),
        pytest.param({"r1-n0": 10, "r1-n1": 20}, 60, [], 2, id="two nodes of one rack are blamed one by one"),
        pytest.param(
            {"r1-n0": 10, "r1-n1": 20, "r2-n0": 30},
            60,
            [],
            3,
            id="three failures spread over two racks are not a rack fault",
        ),
        pytest.param(
            {"r1-n0": 0, "r1-n1": 200, "r1-n2": 400},
            400,
            [],
            3,
            id="failures further apart than the window are not correlated",
        ),
    ],
)
def test_correlated_failures(failing, at, racks, kept):
    findings = [fatal(node=n, kind=FindingKind.HEARTBEAT_TIMEOUT, gpu=None, at=t) for n, t in failing.items()]
    remaining, faults = correlate(findings, fleet(), POLICY, now=at)
    assert [f.rack for f in faults] == racks
    assert len(remaining) == kept


def test_a_rack_fault_names_its_nodes_and_pages_once():
    findings = [
        fatal(node="r1-n0", kind=FindingKind.HEARTBEAT_TIMEOUT, gpu=None, at=5),
        fatal(node="r1-n3", kind=FindingKind.GPU_LOST, at=6),
        fatal(node="r1-n3", kind=FindingKind.XID, at=6),
        finding(node="r1-n5", kind=FindingKind.TEMPERATURE, at=7),
        finding(node="r2-n1", severity=Severity.SUSPECT, at=7),
        finding(node="r1-n6", severity=Severity.INFO, at=7),
    ]
    remaining, [fault] = correlate(findings, fleet(), POLICY, now=10)
    assert fault.node_ids == ("r1-n0", "r1-n3", "r1-n5")
    assert fault.kinds == ("gpu_lost", "heartbeat_timeout", "temperature", "xid")
    assert (fault.first_at, fault.last_at) == (5, 7)
    assert [f.node_id for f in remaining] == ["r2-n1", "r1-n6"]  # other racks and info findings pass through
    alert = rack_fault_alert(fault)
    assert isinstance(alert, Alert) and alert.rack == "r1" and alert.severity == "page"
    assert "3 of 8 nodes" in alert.summary


def decide(rec, event, automated=True):
    after, actions = transition(rec, event, 1.0)
    return Decision(before=rec, after=after, actions=actions, automated=automated)


@pytest.mark.parametrize(
    "pool_size, share, min_nodes, limit",
    [
        pytest.param(100, 0.1, 1, 10, id="10% of 100 nodes is 10"),
        pytest.param(4, 0.1, 1, 1, id="a small pool may still lose its one broken node"),
        pytest.param(4, 0.1, 0, 0, id="with no minimum a small pool is fully protected"),
        pytest.param(19, 0.1, 1, 1, id="shares round down"),
    ],
)
def test_pool_limit(pool_size, share, min_nodes, limit):
    assert pool_limit(pool_size, HealthPolicy(blast_radius_max_share=share, blast_radius_min_nodes=min_nodes)) == limit


def test_a_bad_rule_firing_on_a_whole_pool_cordons_only_the_allowed_share_and_alerts_for_the_rest():
    fleet_ = nodes(20, rack="r1", pool="h100-a")
    records = {n: record(n) for n in fleet_}
    decisions = [decide(records[n], fatal(node=n)) for n in sorted(fleet_)]
    kept = limit_blast_radius(decisions, records, fleet_, HealthPolicy(blast_radius_max_share=0.1))
    moved = [d for d in kept if d.after.state != S.HEALTHY]
    held = [d for d in kept if d.after.state == S.HEALTHY]
    assert len(moved) == 2 and len(held) == 18
    assert all(isinstance(d.actions[0], Alert) and "blast-radius" in d.actions[0].summary for d in held)
    assert all(d.after is d.before for d in held)


def test_nodes_already_out_of_service_use_up_the_budget():
    fleet_ = nodes(20, rack="r1", pool="p")
    records = {n: record(n) for n in fleet_}
    records["r1-n0"] = record("r1-n0", state=S.REPAIR)
    records["r1-n1"] = record("r1-n1", state=S.CORDONED)
    decision = decide(records["r1-n2"], fatal(node="r1-n2"))
    [kept] = limit_blast_radius([decision], records, fleet_, HealthPolicy(blast_radius_max_share=0.1))
    assert kept.after.state == S.HEALTHY and isinstance(kept.actions[0], Alert)


def test_the_budget_goes_to_the_worst_failure_first():
    fleet_ = nodes(10, rack="r1", pool="p")
    records = {n: record(n) for n in fleet_}
    suspect = decide(records["r1-n0"], finding(node="r1-n0"))
    lost = decide(records["r1-n9"], fatal(node="r1-n9", kind=FindingKind.HEARTBEAT_TIMEOUT, gpu=None))
    kept = limit_blast_radius([suspect, lost], records, fleet_, HealthPolicy(blast_radius_max_share=0.1))
    assert [d.after.state for d in kept] == [S.HEALTHY, S.LOST]


def test_operators_and_recoveries_are_never_limited_and_recoveries_free_budget():
    fleet_ = nodes(10, rack="r1", pool="p")
    records = {n: record(n) for n in fleet_}
    records["r1-n0"] = record("r1-n0", state=S.SUSPECT)
    recovery = decide(records["r1-n0"], ChecksPassed(node_id="r1-n0"))
    operator = decide(records["r1-n1"], Cordon(node_id="r1-n1", by="operator:ana", reason="x"), automated=False)
    failure = decide(records["r1-n2"], fatal(node="r1-n2"))
    policy = HealthPolicy(blast_radius_max_share=0.2)  # two nodes of ten
    kept = limit_blast_radius([recovery, operator, failure], records, fleet_, policy)
    assert [d.after.state for d in kept] == [S.HEALTHY, S.CORDONED, S.DRAINING]


def test_two_decisions_for_one_node_in_a_batch_are_a_bug():
    fleet_ = nodes(2)
    rec = record("r1-n0")
    with pytest.raises(ValueError):
        limit_blast_radius([decide(rec, fatal(node="r1-n0"))] * 2, {"r1-n0": rec}, fleet_, HealthPolicy())
