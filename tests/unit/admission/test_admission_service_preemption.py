"""Preemption by least attained service: a job that has received little GPU time stops one that has had more."""

from __future__ import annotations

import pytest
from admission_builders import NOW, admitted_ids, cycle, job, queue, reasons, running, tenancy
from msgspec.structs import replace

from trainyard.core.admission.tree import Scheduling
from trainyard.core.reasons import PendingReason as R
from trainyard.core.reasons import PreemptionReason as P

H = 3600.0
# levels at 1, 64 and 1,024 GPU-hours (the default); victims' current runs must have lasted an hour
SERVICE = {"reclaim": False, "fair_share": False, "attained_service": True, "attained_service_min_runtime_s": H}


def victims(result) -> dict[str, tuple[str, P]]:
    return {p.job_id: (p.preemptor, p.reason) for p in result.preemptions}


CASES = [
    pytest.param(
        tenancy(queue("a", H100=(8, 0)), queue("b", H100=8), **SERVICE),
        [job("new", 8)],
        [running("long", 8, started=NOW - 2 * H)],  # 16 GPU-hours: level 1
        {"long": ("new", P.SERVICE)},
        id="a new job stops a run of its queue that has received more service levels",
    ),
    pytest.param(
        tenancy(queue("a", H100=(8, 0)), queue("b", H100=8), **SERVICE),
        [job("new", 8)],
        [running("short", 8, started=NOW - 300)],  # under 1 GPU-hour: level 0
        {},
        id="no preemption between jobs of the same level",
    ),
    pytest.param(
        tenancy(queue("a", H100=(8, 0)), queue("b", H100=8), **SERVICE),
        [job("new", 8)],
        [running("restarted", 8, started=NOW - 1800, attained=100 * H)],
        {},
        id="a victim's current run must have lasted the minimum run time",
    ),
    pytest.param(
        tenancy(queue("a", H100=(8, 0)), queue("b", H100=8), **SERVICE),
        [job("again", 8, attained=100 * H)],
        [running("long", 8, started=NOW - 2 * H)],
        {},
        id="a job that has had more service does not preempt one that has had less",
    ),
    pytest.param(
        tenancy(queue("a", H100=(8, 0)), queue("b", H100=8), **SERVICE),
        [job("new", 8)],
        [running("prod", 8, started=NOW - 2 * H, priority=10)],
        {},
        id="never a victim of higher priority",
    ),
    pytest.param(
        tenancy(queue("a", H100=(8, 0)), queue("b", H100=8), **SERVICE),
        [job("new", 8)],
        [running("pinned", 8, started=NOW - 2 * H, preemptible=False)],
        {},
        id="never a non-preemptible victim",
    ),
    pytest.param(
        tenancy(queue("a", H100=(8, 0)), queue("b", H100=(8, 0)), **SERVICE),
        [job("new", 8, "a")],
        [running("sibling", 8, "b", started=NOW - 2 * H)],
        {},
        id="a sibling inside its own nominal quota is not a victim",
    ),
    pytest.param(
        tenancy(queue("a", H100=8), queue("b", H100=8), **SERVICE),
        [job("new", 8, "a")],
        [running("b1", 8, "b", started=NOW - 2 * H), running("b2", 8, "b", started=NOW - 2 * H)],
        {"b1": ("new", P.SERVICE)},  # either of b's runs will do: equal ones go by job id
        id="inside its nominal quota a job stops a borrower's run that has had more service",
    ),
    pytest.param(
        tenancy(queue("a", H100=(16, 0)), queue("b", H100=8), **SERVICE),
        [job("new", 8)],
        [running("most", 8, started=NOW - 9 * H, attained=2000 * H), running("less", 8, started=NOW - 2 * H)],
        {"most": ("new", P.SERVICE)},
        id="the most served run goes first",
    ),
    pytest.param(
        tenancy(queue("a", H100=(8, 0)), queue("b", H100=8), reclaim=False, fair_share=False),
        [job("new", 8)],
        [running("long", 8, started=NOW - 2 * H)],
        {},
        id="off unless the tenancy turns it on",
    ),
]


@pytest.mark.parametrize("tree, pending, holders, expected", CASES)
def test_service_preemption(tree, pending, holders, expected):
    capacity = {"H100": 8}
    if len(holders) > 1:
        capacity = {"H100": 8 * len(holders)}
    result = cycle(tree, pending, holders, capacity=capacity)
    assert victims(result) == expected
    assert admitted_ids(result) == []
    if expected:
        assert reasons(result)[pending[0].job_id] is R.PREEMPTING


def test_each_blocked_job_may_stop_its_own_victim_in_one_cycle():
    tree = tenancy(queue("a", H100=16), queue("b", H100=8), **SERVICE)
    # short of GPUs (not of quota), with run-time limits known: the first job reserves, the second would
    # backfill; both look for victims
    holders = [
        running("l1", 8, started=NOW - 3 * H, ends=NOW + 9 * H),
        running("l2", 8, started=NOW - 2 * H, ends=NOW + 9 * H),
    ]
    result = cycle(tree, [job("n1", 8), job("n2", 8)], holders, capacity={"H100": 16})
    # same level: the cheaper victim (less work since its start) goes to the first job in line
    assert victims(result) == {"l2": ("n1", P.SERVICE), "l1": ("n2", P.SERVICE)}


def test_fifo_order_turns_it_off():
    tree = tenancy(queue("a", H100=(8, 0)), queue("b", H100=8), **SERVICE)
    tree = replace(tree, scheduling=Scheduling(order="fifo"))
    result = cycle(tree, [job("new", 8)], [running("long", 8, started=NOW - 2 * H)], capacity={"H100": 8})
    assert result.preemptions == []
