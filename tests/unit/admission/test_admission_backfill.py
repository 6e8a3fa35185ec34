"""EASY backfill in admission, and the order inside a queue (least attained service, aging)."""

from __future__ import annotations

import msgspec
import pytest
from admission_builders import NOW, admitted_ids, cohort, cycle, job, queue, reasons, running, tenancy

from trainyard.core.admission import AdmissionPolicy, AdmissionSnapshot, admit
from trainyard.core.admission.tree import Scheduling
from trainyard.core.reasons import PendingReason as R

HOUR = 3600.0
NO_PREEMPTION = {"within_queue": False, "reclaim": False, "fair_share": False}


def shared_pool(**scheduling: object):
    """Two queues borrowing everything from one 16-GPU organisation."""
    tree = tenancy(queue("a", H100=0), queue("b", H100=0), cohorts=[cohort("org", H100=16)], **NO_PREEMPTION)
    return msgspec.structs.replace(tree, scheduling=Scheduling(**scheduling)) if scheduling else tree


@pytest.mark.parametrize(
    "small_limit, held_until, admitted, small_reason",
    [
        pytest.param(
            HOUR, NOW + 2 * HOUR, ["b-small"], None, id="a small job that ends before the big one can start runs now"
        ),
        pytest.param(
            3 * HOUR,
            NOW + 2 * HOUR,
            [],
            R.RESERVED_FOR_LARGER_JOB,
            id="a small job that would still run when the big one could start waits",
        ),
        pytest.param(
            None,
            NOW + 2 * HOUR,
            [],
            R.RESERVED_FOR_LARGER_JOB,
            id="a job without a run-time limit is taken to run for ever and waits",
        ),
        pytest.param(
            HOUR,
            None,
            [],
            R.RESERVED_FOR_LARGER_JOB,
            id="while the GPUs are held by a run without a limit nothing goes ahead",
        ),
    ],
)
def test_backfill_lets_later_jobs_start_only_if_they_do_not_delay_the_first_blocked_job(
    small_limit, held_until, admitted, small_reason
):
    pending = [job("a-big", 16, "a", order=1), job("b-small", 4, "b", order=2, limit=small_limit)]
    result = cycle(shared_pool(), pending, [running("r", 8, "b", ends=held_until)], capacity={"H100": 16})
    assert admitted_ids(result) == admitted
    assert reasons(result).get("b-small") == small_reason
    assert reasons(result)["a-big"] == R.COHORT_EXHAUSTED


def test_a_long_job_may_use_gpus_the_blocked_job_will_not_need():
    # 24 GPUs; 16 held until +2 h; the big job needs 20: at +2 h 24 are free, 4 to spare
    tree = tenancy(queue("a", H100=0), queue("b", H100=0), cohorts=[cohort("org", H100=24)], **NO_PREEMPTION)
    pending = [
        job("a-big", 20, "a", order=1),
        job("b-long", 4, "b", order=2, limit=10 * HOUR),
        job("b-long-2", 4, "b", order=3, limit=10 * HOUR),
    ]
    result = cycle(tree, pending, [running("r", 16, "b", ends=NOW + 2 * HOUR)], capacity={"H100": 24})
    assert admitted_ids(result) == ["b-long"]
    assert reasons(result)["b-long-2"] == R.RESERVED_FOR_LARGER_JOB


def test_a_blocked_job_no_longer_holds_up_the_later_jobs_of_its_own_queue():
    pending = [job("a-big", 16, "a", order=1), job("a-small", 4, "a", order=2, limit=HOUR)]
    result = cycle(shared_pool(), pending, [running("r", 8, "b", ends=NOW + 2 * HOUR)], capacity={"H100": 16})
    assert admitted_ids(result) == ["a-small"]


def test_without_backfill_the_blocked_job_holds_up_its_queue():
    pending = [job("a-big", 16, "a", order=1), job("a-small", 4, "a", order=2, limit=HOUR)]
    result = cycle(
        shared_pool(backfill=False, order="fifo"),
        pending,
        [running("r", 8, "b", ends=NOW + 2 * HOUR)],
        capacity={"H100": 16},
    )
    assert admitted_ids(result) == []
    assert reasons(result)["a-small"] == R.QUEUED_BEHIND


@pytest.mark.parametrize(
    "scheduling, expected",
    [
        pytest.param(
            {},
            ["fresh", "ran-a-little", "ran-a-lot"],
            id="least attained service: jobs whose earlier runs got fewer GPU-hours go first",
        ),
        pytest.param(
            {"order": "fifo"},
            ["ran-a-lot", "ran-a-little", "fresh"],
            id="fifo: submission order whatever the earlier runs got",
        ),
    ],
)
def test_order_inside_a_queue(scheduling, expected):
    tree = tenancy(queue("a", H100=8), **NO_PREEMPTION)
    tree = msgspec.structs.replace(tree, scheduling=Scheduling(backfill=False, **scheduling))
    pending = [
        job("ran-a-lot", 8, order=1, attained=2000 * HOUR),
        job("ran-a-little", 8, order=2, attained=2 * HOUR),
        job("fresh", 8, order=3),
    ]
    admitted = []
    for _ in expected:
        result = cycle(tree, [j for j in pending if j.job_id not in admitted], capacity={"H100": 8})
        admitted += admitted_ids(result)
    assert admitted == expected


def test_a_job_that_waited_past_the_starvation_limit_goes_ahead_of_every_service_level():
    tree = tenancy(queue("a", H100=8), **NO_PREEMPTION)
    tree = msgspec.structs.replace(tree, scheduling=Scheduling(backfill=False, starvation_s=24 * HOUR))
    pending = [
        job("old-heavy", 8, order=1, attained=2000 * HOUR, submitted=NOW - 25 * HOUR),
        job("fresh", 8, order=2, submitted=NOW),
    ]
    assert admitted_ids(cycle(tree, pending, capacity={"H100": 8})) == ["old-heavy"]
    pending[0] = job("old-heavy", 8, order=1, attained=2000 * HOUR, submitted=NOW - 23 * HOUR)
    assert admitted_ids(cycle(tree, pending, capacity={"H100": 8})) == ["fresh"]


def test_pending_jobs_handed_over_in_admission_order_are_taken_as_given():
    tree = tenancy(queue("a", H100=8), **NO_PREEMPTION)
    tree = msgspec.structs.replace(tree, scheduling=Scheduling(backfill=False, starvation_s=24 * HOUR))
    old = job("old-heavy", 8, order=1, attained=2000 * HOUR, submitted=NOW - 25 * HOUR)
    fresh = job("fresh", 8, order=2, submitted=NOW)
    policy = AdmissionPolicy(tenancy=tree)

    def decide(pending: list, in_order: bool) -> list[str]:
        snapshot = AdmissionSnapshot(pending, {"H100": 8}, {}, pending_in_order=in_order)
        return admitted_ids(admit(snapshot, policy, NOW))

    # the core's own order puts the starved job first: handed over in that order, the same decision
    assert decide([fresh, old], in_order=False) == decide([old, fresh], in_order=True) == ["old-heavy"]
    # the flag is the caller's promise: the order given is the one used
    assert decide([fresh, old], in_order=True) == ["fresh"]


@pytest.mark.parametrize(
    "scheduling, big_waited, admitted",
    [
        pytest.param(
            {"reserve_after_s": 6 * HOUR},
            1 * HOUR,
            ["b-long"],
            id="a job that has waited less than the reservation delay lets a long job start around it",
        ),
        pytest.param(
            {"reserve_after_s": 6 * HOUR},
            7 * HOUR,
            [],
            id="a job that has waited past the reservation delay holds its GPUs against a long job",
        ),
        pytest.param({"reserve_after_s": 0.0}, 0.0, [], id="reserving at once holds them from the start"),
        pytest.param({"reserve": False}, 30 * HOUR, ["b-long"], id="greedy backfill never holds anything"),
    ],
)
def test_when_a_blocked_job_starts_to_hold_a_reservation(scheduling, big_waited, admitted):
    pending = [
        job("a-big", 16, "a", order=1, submitted=NOW - big_waited),
        job("b-long", 4, "b", order=2, limit=10 * HOUR, submitted=NOW),
    ]
    result = cycle(
        shared_pool(**scheduling), pending, [running("r", 8, "b", ends=NOW + 2 * HOUR)], capacity={"H100": 16}
    )
    assert admitted_ids(result) == admitted


@pytest.mark.parametrize(
    "waited, preempts",
    [
        pytest.param(60.0, [], id="a job just blocked does not reclaim lent quota yet"),
        pytest.param(7 * HOUR, ["b-borrowed"], id="a job that has waited past the reservation delay reclaims it"),
    ],
)
def test_reclaiming_lent_quota_waits_for_the_reservation(waited, preempts):
    tree = tenancy(queue("a", H100=8), queue("b", H100=8), within_queue=True, reclaim=True, fair_share=False)
    pending = [job("a-own", 8, "a", order=1, submitted=NOW - waited)]
    holders = [running("b-own", 8, "b", ends=NOW + 10 * HOUR), running("b-borrowed", 8, "b", ends=NOW + 10 * HOUR)]
    result = cycle(tree, pending, holders, capacity={"H100": 16})
    assert [p.job_id for p in result.preemptions] == preempts


def test_priority_preemption_does_not_wait_for_the_reservation():
    tree = tenancy(queue("a", H100=8), within_queue=True, reclaim=True, fair_share=False)
    pending = [job("urgent", 8, "a", order=2, priority=100, submitted=NOW - 60.0)]
    holders = [running("routine", 8, "a", priority=0, ends=NOW + 10 * HOUR)]
    result = cycle(tree, pending, holders, capacity={"H100": 8})
    assert [(p.job_id, p.preemptor, p.reason.value) for p in result.preemptions] == [("routine", "urgent", "priority")]
