"""Order inside a queue (priority, then submission) and across queues (fair share)."""

from __future__ import annotations

import math

import msgspec
import pytest
from admission_builders import NOW, admitted_ids, cohort, cycle, job, queue, reasons, running, tenancy

from trainyard.core.admission import decay_usage, decay_usage_table
from trainyard.core.admission.ordering import DemandCache
from trainyard.core.admission.tree import Scheduling
from trainyard.core.reasons import PendingReason as R

NO_PREEMPTION = {"within_queue": False, "reclaim": False, "fair_share": False}


@pytest.mark.parametrize(
    "pending, admitted",
    [
        pytest.param(
            [job("low", 8, priority=0, order=1), job("high", 8, priority=10, order=2)],
            ["high"],
            id="a higher-priority job goes before an earlier lower-priority one in the same queue",
        ),
        pytest.param(
            [job("second", 8, order=2), job("first", 8, order=1)],
            ["first"],
            id="equal priority goes by submission order",
        ),
        pytest.param(
            [job("x", 8, order=5), job("w", 8, order=5)], ["w"], id="equal submission order breaks the tie by job id"
        ),
    ],
)
def test_order_inside_a_queue(pending, admitted):
    tree = tenancy(queue("a", H100=(8, 0)), queue("b", H100=8), **NO_PREEMPTION)
    assert admitted_ids(cycle(tree, pending)) == admitted


def test_a_waiting_gang_holds_up_later_jobs_of_its_type_in_its_queue_only():
    tree = tenancy(queue("a", H100=(16, 0), A100=8), queue("b", H100=16), **NO_PREEMPTION)
    pending = [
        job("big", 16, order=1),
        job("small", 4, order=2),
        job("other-type", 4, gpu="A100", order=3),
        job("other-queue", 4, tenant="b", order=4),
    ]
    result = cycle(tree, pending, [running("r", 4)], capacity={"H100": 32, "A100": 8})
    assert reasons(result) == {"big": R.QUOTA, "small": R.QUEUED_BEHIND}
    assert sorted(admitted_ids(result)) == ["other-queue", "other-type"]


def test_the_tenant_holding_less_goes_first():
    tree = tenancy(queue("a", H100=0), queue("b", H100=0), cohorts=[cohort("org", H100=16)], **NO_PREEMPTION)
    pending = [job("a1", 8, "a", order=1), job("b1", 8, "b", order=2)]
    result = cycle(tree, pending, [running("ra", 8, "a")], capacity={"H100": 16})
    assert admitted_ids(result) == ["b1"]
    assert reasons(result) == {"a1": R.COHORT_EXHAUSTED}


def test_recent_use_counts_against_a_tenant():
    tree = tenancy(queue("a", H100=0), queue("b", H100=0), cohorts=[cohort("org", H100=8)], **NO_PREEMPTION)
    pending = [job("a1", 8, "a", order=1), job("b1", 8, "b", order=2)]
    history = {"a/q": {"H100": 8 * 3600.0}}
    assert admitted_ids(cycle(tree, pending, history=history)) == ["b1"]
    assert admitted_ids(cycle(tree, pending)) == ["a1"]


def test_weights_split_borrowed_capacity():
    tree = tenancy(
        queue("a", weight=2, H100=0), queue("b", weight=1, H100=0), cohorts=[cohort("org", H100=12)], **NO_PREEMPTION
    )
    pending = [job(f"{t}{i}", 1, t, order=i) for i in range(12) for t in "ab"]
    admitted = admitted_ids(cycle(tree, pending, capacity={"H100": 12}))
    assert sum(j.startswith("a") for j in admitted) == 8
    assert sum(j.startswith("b") for j in admitted) == 4


def test_jobs_within_their_nominal_quota_go_before_borrowers():
    tree = tenancy(queue("a", H100=8), queue("b", H100=8), **NO_PREEMPTION)
    pending = [job("a-borrows", 16, "a", order=1), job("b-own", 8, "b", order=2)]
    result = cycle(tree, pending, history={"b/q": {"H100": 1e9}})
    assert admitted_ids(result) == ["b-own"]


def test_a_borrower_waiting_for_gpus_holds_them_against_later_borrowers():
    tree = tenancy(queue("a", H100=0), queue("b", H100=0), cohorts=[cohort("org", H100=16)], **NO_PREEMPTION)
    pending = [job("a-big", 16, "a", order=1), job("b-small", 4, "b", order=2)]
    result = cycle(tree, pending, [running("r", 8, "b")], capacity={"H100": 16}, history={"b/q": {"H100": 1e6}})
    assert admitted_ids(result) == []
    assert reasons(result) == {"a-big": R.COHORT_EXHAUSTED, "b-small": R.RESERVED_FOR_LARGER_JOB}


def test_without_backfill_a_borrower_waiting_for_gpus_blocks_later_borrowers_by_fair_share():
    tree = tenancy(queue("a", H100=0), queue("b", H100=0), cohorts=[cohort("org", H100=16)], **NO_PREEMPTION)
    tree = msgspec.structs.replace(tree, scheduling=Scheduling(backfill=False, order="fifo"))
    pending = [job("a-big", 16, "a", order=1), job("b-small", 4, "b", order=2)]
    result = cycle(tree, pending, [running("r", 8, "b")], capacity={"H100": 16}, history={"b/q": {"H100": 1e6}})
    assert admitted_ids(result) == []
    assert reasons(result) == {"a-big": R.COHORT_EXHAUSTED, "b-small": R.FAIR_SHARE}


def test_max_admissions_per_cycle_leaves_the_rest_queued_behind():
    tree = tenancy(queue("a", H100=64), queue("b", H100=64))
    result = cycle(tree, [job(gpus=1) for _ in range(5)], max_admissions_per_cycle=2)
    assert len(result.admitted) == 2
    assert [w.reason for w in result.waiting] == [R.QUEUED_BEHIND] * 3


@pytest.mark.parametrize(
    "prev, used, elapsed, half_life, expected",
    [
        pytest.param(100.0, 0.0, 3600.0, 3600.0, 50.0, id="usage halves after one half-life"),
        pytest.param(100.0, 0.0, 7200.0, 3600.0, 25.0, id="and quarters after two"),
        pytest.param(100.0, 10.0, 0.0, 3600.0, 110.0, id="no time passed adds the new use"),
        pytest.param(
            0.0, 3600.0, 3600.0, 3600.0, 3600.0 / (2 * math.log(2)), id="new use is decayed over its interval"
        ),
    ],
)
def test_decay_usage(prev, used, elapsed, half_life, expected):
    assert decay_usage(prev, used, elapsed, half_life) == pytest.approx(expected)


def test_steady_use_converges_to_gpus_times_half_life_over_ln2():
    value = 0.0
    for _ in range(2000):
        value = decay_usage(value, 8 * 60.0, 60.0, 3600.0)
    assert value == pytest.approx(8 * 3600.0 / math.log(2), rel=1e-3)
    table = decay_usage_table({"a/q": {"H100": 100.0}}, {"b/q": {"A100": 50.0}}, 0.0, 3600.0)
    assert table == {"a/q": {"H100": 100.0}, "b/q": {"A100": 50.0}}


def test_the_cycle_reads_no_clock_same_input_same_output():
    tree = tenancy(queue("a", H100=8), queue("b", H100=8))
    pending = [job(f"j{i}", 2, "ab"[i % 2], order=i, priority=i % 3) for i in range(20)]
    assert cycle(tree, pending, now=NOW) == cycle(tree, list(reversed(pending)), now=NOW)


def test_a_large_gang_is_not_starved_by_a_stream_of_small_jobs_from_another_tenant():
    tree = tenancy(queue("a", H100=0), queue("b", H100=0), cohorts=[cohort("org", H100=16)], **NO_PREEMPTION)
    big = job("a-big", 16, "a", order=0)
    running_jobs = [running(f"b-old{i}", 4, "b", started=NOW - 60 * i) for i in range(4)]
    pending = [big]
    for c in range(1, 10):
        pending += [job(f"b{c}-{i}", 4, "b", order=10 * c + i) for i in range(2)]
        now = NOW + 60 * c
        running_jobs = [r for r in running_jobs if now - r.started_at < 120]  # every job runs two cycles
        result = cycle(tree, pending, running_jobs, capacity={"H100": 16}, now=now)
        if "a-big" in admitted_ids(result):
            break
        started = set(admitted_ids(result))
        running_jobs += [running(j.job_id, 4, "b", started=now) for j in pending if j.job_id in started]
        pending = [j for j in pending if j.job_id not in started]
    else:
        raise AssertionError("the large gang never started")
    assert c <= 4


def test_equal_requests_share_one_demand_for_the_cycle():
    # The cycle keys its quota answers on the demand object: equal requests must get the same one.
    demands = DemandCache({"H100": 0, "A100": 1})
    assert demands({"H100": 8}) is demands({"H100": 8}) == [(0, 8)]
    assert demands({"H100": 8, "A100": 2}) is demands({"H100": 8, "A100": 2}) == [(0, 8), (1, 2)]
    assert demands({"H100": 8}) is not demands({"H100": 4})
    assert demands({"H100": 8, "A100": 2}) is not demands({"H100": 8, "A100": 4})
    assert demands({"B200": 1}) is None and demands({"H100": 1, "B200": 1}) is None  # a type nobody has
