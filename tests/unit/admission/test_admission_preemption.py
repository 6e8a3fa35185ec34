"""Preemption: priority within a queue, reclaim of borrowed quota, fair share; checkpoint-aware victims."""

from __future__ import annotations

import pytest
from admission_builders import NOW, admitted_ids, cohort, cycle, job, queue, reasons, running, tenancy

from trainyard.core.reasons import PendingReason as R
from trainyard.core.reasons import PreemptionReason as P

OWN = {"reclaim": False, "fair_share": False}


def victims(result) -> dict[str, tuple[str, P]]:
    return {p.job_id: (p.preemptor, p.reason) for p in result.preemptions}


CASES = [
    pytest.param(
        tenancy(queue("a", H100=(8, 0)), queue("b", H100=8), **OWN),
        [job("hi", 8, priority=10)],
        [running("lo", 8, priority=0)],
        {"lo": ("hi", P.PRIORITY)},
        id="a higher-priority job preempts a lower-priority one in its queue",
    ),
    pytest.param(
        tenancy(queue("a", H100=(8, 0)), queue("b", H100=8), **OWN),
        [job("hi", 8, priority=10)],
        [running("lo", 8, priority=0, preemptible=False)],
        {},
        id="a non-preemptible job is never a victim",
    ),
    pytest.param(
        tenancy(queue("a", H100=(8, 0)), queue("b", H100=8), **OWN),
        [job("same", 8, priority=0)],
        [running("lo", 8, priority=0)],
        {},
        id="equal priority does not preempt",
    ),
    pytest.param(
        tenancy(queue("a", H100=(8, 0)), queue("b", H100=8), **OWN),
        [job("hi", 4, priority=10)],
        [running("fresh", 4, checkpoint=NOW - 60), running("stale", 4, checkpoint=NOW - 3000)],
        {"fresh": ("hi", P.PRIORITY)},
        id="the victim is the one that loses least work since its last checkpoint",
    ),
    pytest.param(
        tenancy(queue("a", H100=(12, 0)), queue("b", H100=8), **OWN),
        [job("hi", 8, priority=10)],
        [running("small", 4, checkpoint=NOW - 10), running("whole", 8, checkpoint=NOW - 30)],
        {"whole": ("hi", P.PRIORITY)},
        id="victims that turn out not to be needed are handed back",
    ),
    pytest.param(
        tenancy(queue("a", H100=16), queue("b", H100=16), fair_share=False),
        [job("own", 16, "a")],
        [running("borrowed", 24, "b")],
        {"borrowed": ("own", P.RECLAIM)},
        id="a queue within its nominal quota reclaims what a sibling borrowed",
    ),
    pytest.param(
        tenancy(queue("a", H100=16), queue("b", H100=16), fair_share=False),
        [job("own", 16, "a")],
        [running("be", 8, "b", best_effort=True), running("b-own", 16, "b")],
        {"be": ("own", P.RECLAIM)},
        id="best-effort jobs are reclaimed first",
    ),
    pytest.param(
        tenancy(queue("a", H100=0), queue("b", H100=0), cohorts=[cohort("org", H100=16)], min_runtime_s=600),
        [job("a1", 8, "a")],
        [running("b1", 8, "b"), running("b2", 8, "b")],
        {"b1": ("a1", P.FAIR_SHARE)},
        id="a tenant below its fair share preempts one above it",
    ),
    pytest.param(
        tenancy(queue("a", H100=0), queue("b", H100=0), cohorts=[cohort("org", H100=16)], min_runtime_s=600),
        [job("a1", 8, "a")],
        [running("b1", 8, "b", started=NOW - 60), running("b2", 8, "b", started=NOW - 60)],
        {},
        id="fair-share victims must have run the minimum runtime",
    ),
    pytest.param(
        tenancy(queue("a", H100=0), queue("b", H100=0), cohorts=[cohort("org", H100=16)]),
        [job("a1", 16, "a")],
        [running("b1", 8, "b"), running("b2", 8, "b")],
        {},
        id="no fair-share preemption that would leave the preemptor above the victim",
    ),
]


@pytest.mark.parametrize("tree, pending, holders, expected", CASES)
def test_preemption(tree, pending, holders, expected):
    result = cycle(tree, pending, holders)
    assert victims(result) == expected
    assert admitted_ids(result) == []
    if expected:
        assert reasons(result)[pending[0].job_id] is R.PREEMPTING


def test_fair_share_preemptions_are_rate_limited():
    tree = tenancy(
        queue("a", H100=0),
        queue("b", H100=0),
        cohorts=[cohort("org", H100=16)],
        fair_share_limit=2,
        fair_share_window_s=600,
    )
    holders = [running("b1", 8, "b"), running("b2", 8, "b")]
    recent = [NOW - 100, NOW - 200]
    assert cycle(tree, [job("a1", 8, "a")], holders, recent=recent).preemptions == []
    assert len(cycle(tree, [job("a1", 8, "a")], holders, recent=[NOW - 700, NOW - 800]).preemptions) == 1


def test_a_job_waiting_for_noticed_victims_does_not_preempt_again():
    tree = tenancy(queue("a", H100=(8, 0)), queue("b", H100=8), **OWN)
    holders = [running("lo1", 8, priority=0, notice=NOW - 5)]
    result = cycle(tree, [job("hi", 8, priority=10)], holders + [running("lo2", 0, priority=0)])
    assert result.preemptions == []
    assert reasons(result) == {"hi": R.PREEMPTING}


def test_a_notice_carries_the_grace_period_and_the_work_lost():
    tree = tenancy(queue("a", H100=(8, 0)), queue("b", H100=8), grace_period_s=120, **OWN)
    result = cycle(tree, [job("hi", 8, priority=10)], [running("lo", 8, checkpoint=NOW - 100)])
    [notice] = result.preemptions
    assert notice.grace_period_s == 120
    assert notice.lost_gpu_seconds == pytest.approx(800.0)


def test_room_made_by_preemption_is_held_for_the_preemptor():
    tree = tenancy(queue("a", H100=(8, 0)), queue("b", H100=8), **OWN)
    pending = [job("hi", 8, priority=10, order=1), job("hi2", 8, priority=10, order=2)]
    result = cycle(tree, pending, [running("lo", 8)])
    assert victims(result) == {"lo": ("hi", P.PRIORITY)}
    assert reasons(result) == {"hi": R.PREEMPTING, "hi2": R.QUEUED_BEHIND}


def test_reclaim_never_takes_a_sibling_below_its_own_nominal_quota():
    tree = tenancy(queue("a", H100=16), queue("b", H100=16), fair_share=False)
    holders = [running("b-own", 16, "b"), running("a-run", 8, "a")]
    result = cycle(tree, [job("own", 8, "a")], holders, capacity={"H100": 24})
    assert result.preemptions == []
    assert reasons(result) == {"own": R.INSUFFICIENT_GPUS}


def test_fair_share_never_preempts_a_job_inside_its_queues_nominal_quota():
    tree = tenancy(queue("a", H100=0), queue("b", H100=16), cohorts=[cohort("org", H100=16)])
    result = cycle(tree, [job("a1", 8, "a")], [running("b1", 8, "b"), running("b2", 8, "b")])
    assert result.preemptions == []
    assert reasons(result) == {"a1": R.COHORT_EXHAUSTED}
