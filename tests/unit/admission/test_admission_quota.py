"""Quota tree: nominal quota, borrowing within the cohort, borrowing and lending limits."""

from __future__ import annotations

import pytest
from admission_builders import NOW, admitted_ids, cohort, cycle, job, queue, reasons, running, tenancy

from trainyard.core.reasons import PendingReason as R

CASES = [
    pytest.param(
        tenancy(queue("a", H100=16), queue("b", H100=16)),
        [job("j", gpus=16, tenant="a")],
        [],
        None,
        "j",
        None,
        id="a gang that fits the queue's nominal quota is admitted",
    ),
    pytest.param(
        tenancy(queue("a", H100=16), queue("b", H100=16)),
        [job("j", gpus=24, tenant="a")],
        [],
        None,
        "j",
        None,
        id="a queue borrows from an idle sibling in its cohort",
    ),
    pytest.param(
        tenancy(queue("a", H100=(16, 4)), queue("b", H100=16)),
        [job("j", gpus=24, tenant="a")],
        [],
        None,
        None,
        R.GANG_LARGER_THAN_QUOTA,
        id="a gang beyond nominal plus borrowing limit could never run",
    ),
    pytest.param(
        tenancy(queue("a", H100=(16, 8)), queue("b", H100=16)),
        [job("j", gpus=8, tenant="a")],
        [running("r", gpus=20, tenant="a")],
        None,
        None,
        R.QUOTA,
        id="the borrowing limit stops a queue that already borrows",
    ),
    pytest.param(
        tenancy(queue("a", H100=(16, 0)), queue("b", H100=16)),
        [job("j", gpus=8, tenant="a")],
        [running("r", gpus=16, tenant="a")],
        None,
        None,
        R.QUOTA,
        id="a queue that may not borrow waits when its own quota is in use",
    ),
    pytest.param(
        tenancy(queue("a", H100=16), queue("b", H100=(16, None, 4))),
        [job("j", gpus=24, tenant="a")],
        [],
        None,
        None,
        R.GANG_LARGER_THAN_QUOTA,
        id="a lender's kept-back quota is never borrowed even when it is idle",
    ),
    pytest.param(
        tenancy(queue("a", H100=16), queue("b", H100=(16, None, 4))),
        [job("j", gpus=20, tenant="a")],
        [],
        None,
        "j",
        None,
        id="borrowing up to a sibling's lending limit is allowed",
    ),
    pytest.param(
        tenancy(queue("a", H100=16), queue("b", H100=16)),
        [job("j", gpus=8, tenant="a")],
        [running("r1", 16, "a"), running("r2", 16, "b")],
        None,
        None,
        R.COHORT_EXHAUSTED,
        id="the cohort is exhausted when every sibling uses its own quota",
    ),
    pytest.param(
        tenancy(queue("a", H100=16, A100=0), queue("b", H100=16)),
        [job("j", gpus=8, tenant="a", gpu="A100")],
        [],
        {"H100": 32, "A100": 8},
        None,
        R.NO_QUOTA_FOR_TYPE,
        id="a type that no node of the tree holds quota for cannot be borrowed",
    ),
    pytest.param(
        tenancy(queue("a", H100=16), queue("b", H100=16, A100=8)),
        [job("j", gpus=8, tenant="a", gpu="A100")],
        [],
        {"H100": 32, "A100": 8},
        None,
        R.NO_QUOTA_FOR_TYPE,
        id="a queue whose quota does not list a type cannot use it",
    ),
    pytest.param(
        tenancy(queue("a", H100=16), queue("b", H100=16)),
        [job("j", gpus=8, tenant="nobody")],
        [],
        None,
        None,
        R.UNKNOWN_QUEUE,
        id="a job for a queue not in the tenancy waits with unknown_queue",
    ),
    pytest.param(
        tenancy(queue("a", H100=16), queue("b", H100=16)),
        [job("j", gpus=8, tenant="a", gpu="B200")],
        [],
        None,
        None,
        R.NO_CAPACITY_OF_TYPE,
        id="a GPU type the cluster does not have",
    ),
    pytest.param(
        tenancy(queue("a", H100=64), queue("b", H100=64)),
        [job("j", gpus=64, tenant="a")],
        [],
        {"H100": 32},
        None,
        R.GANG_LARGER_THAN_CLUSTER,
        id="a gang larger than the cluster's GPUs of that type",
    ),
    pytest.param(
        tenancy(queue("a", H100=16), queue("b", H100=16), reclaim=False, fair_share=False),
        [job("j", gpus=16, tenant="a")],
        [running("r", 24, "b")],
        {"H100": 32},
        None,
        R.COHORT_EXHAUSTED,
        id="quota a sibling borrowed is not free until it is given back (preemption off)",
    ),
    pytest.param(
        tenancy(queue("a", H100=16), queue("b", H100=16)),
        [job("j", gpus=16, tenant="a")],
        [running("r", 8, "b")],
        {"H100": 16},
        None,
        R.INSUFFICIENT_GPUS,
        id="within quota but the cluster has fewer free GPUs than quota promises",
    ),
    pytest.param(
        tenancy(queue("a", H100=(16, None, 0)), queue("b", H100=16)),
        [job("j", gpus=8, tenant="a", best_effort=True)],
        [running("r", 16, "b")],
        None,
        None,
        R.COHORT_EXHAUSTED,
        id="a best-effort job does not run in its own queue's kept-back quota",
    ),
    pytest.param(
        tenancy(queue("a", H100=(16, None, 0)), queue("b", H100=16)),
        [job("j", gpus=8, tenant="a", best_effort=True)],
        [],
        None,
        "j",
        None,
        id="a best-effort job runs on a sibling's idle quota",
    ),
    pytest.param(
        tenancy(
            queue("a", cohort="t1", H100=8),
            queue("b", cohort="t2", H100=8),
            cohorts=[cohort("o", H100=32), cohort("t1", "o", H100=(16, 0)), cohort("t2", "o", H100=16)],
        ),
        [job("j", gpus=24, tenant="a")],
        [],
        None,
        None,
        R.GANG_LARGER_THAN_QUOTA,
        id="a team's borrowing limit caps every queue under it",
    ),
    pytest.param(
        tenancy(
            queue("a", cohort="t1", H100=8),
            queue("b", cohort="t2", H100=8),
            cohorts=[cohort("o", H100=32), cohort("t1", "o", H100=16), cohort("t2", "o", H100=16)],
        ),
        [job("j", gpus=32, tenant="a")],
        [],
        None,
        "j",
        None,
        id="a queue borrows across teams through the organisation when nothing is kept back",
    ),
    pytest.param(
        tenancy(
            queue("a", cohort="t1", H100=8),
            queue("b", cohort="t2", H100=8),
            cohorts=[cohort("o", H100=32), cohort("t1", "o", H100=16), cohort("t2", "o", H100=(16, None, 8))],
        ),
        [job("j", gpus=8, tenant="a")],
        [running("r", 16, "a")],
        None,
        "j",
        None,
        id="a team lends what is above its kept-back quota to the other team",
    ),
]


@pytest.mark.parametrize("tree, pending, holders, capacity, admitted, reason", CASES)
def test_quota(tree, pending, holders, capacity, admitted, reason):
    result = cycle(tree, pending, holders, capacity=capacity)
    if admitted is not None:
        assert admitted_ids(result) == [admitted]
    else:
        assert admitted_ids(result) == []
        assert reasons(result)[pending[0].job_id] is reason


def test_backoff_waits_without_holding_up_its_queue():
    tree = tenancy(queue("a", H100=16), queue("b", H100=16))
    pending = [job("early", 8, order=1, not_before=NOW + 60), job("late", 8, order=2)]
    result = cycle(tree, pending)
    assert admitted_ids(result) == ["late"]
    assert reasons(result) == {"early": R.BACKOFF}


def test_backoff_that_has_passed_is_admitted():
    tree = tenancy(queue("a", H100=16), queue("b", H100=16))
    result = cycle(tree, [job("j", 8, not_before=NOW - 1)])
    assert admitted_ids(result) == ["j"]


def test_as_many_jobs_as_fit_are_admitted_in_one_cycle():
    tree = tenancy(queue("a", H100=32), queue("b", H100=32))
    pending = [job(gpus=8, tenant=t) for t in "ab" for _ in range(5)]
    result = cycle(tree, pending)
    assert len(result.admitted) == 8
    assert {w.reason for w in result.waiting} <= {R.COHORT_EXHAUSTED, R.QUEUED_BEHIND, R.FAIR_SHARE}


def test_every_waiting_job_has_a_reason_and_its_place_in_its_queue():
    tree = tenancy(queue("a", H100=8), queue("b", H100=8))
    pending = [job(f"a{i}", 8, "a", order=i) for i in range(4)] + [job("b0", 8, "b", order=9)]
    result = cycle(tree, pending)
    positions = {w.job_id: w.position for w in result.waiting}
    assert len(result.admitted) + len(result.waiting) == len(pending)
    assert [positions[f"a{i}"] for i in range(1, 4) if f"a{i}" in positions] == sorted(
        positions[f"a{i}"] for i in range(1, 4) if f"a{i}" in positions
    )
    assert all(p >= 1 for p in positions.values())
