"""Callers that build snapshots the old way keep first-in-first-out while GPUs are free."""

from __future__ import annotations

import pytest

from trainyard.core.admission import AdmissionPolicy, AdmissionResult, AdmissionSnapshot, PendingJob, admit
from trainyard.core.admission.cycle import Admit, Waiting
from trainyard.core.reasons import PendingReason as R


def pending(job_id: str, order: int, **gpus: int) -> PendingJob:
    return PendingJob(job_id, "t", "q", order, gpus)


@pytest.mark.parametrize(
    "jobs, capacity, in_use, admitted, waiting",
    [
        pytest.param(
            [pending("a", 1, H100=8), pending("b", 2, H100=8)],
            {"H100": 16},
            {},
            ["a", "b"],
            [],
            id="jobs are admitted in submission order while GPUs are free",
        ),
        pytest.param(
            [pending("big", 1, H100=16), pending("small", 2, H100=4)],
            {"H100": 16},
            {"H100": 8},
            [],
            [("big", R.INSUFFICIENT_GPUS, 1), ("small", R.QUEUED_BEHIND, 2)],
            id="a large job is never overtaken by smaller ones of the same type",
        ),
        pytest.param(
            [pending("big", 1, H100=16), pending("other", 2, A100=4)],
            {"H100": 16, "A100": 8},
            {"H100": 8},
            ["other"],
            [("big", R.INSUFFICIENT_GPUS, 1)],
            id="another GPU type is not held up",
        ),
        pytest.param(
            [pending("never", 1, H100=64), pending("next", 2, H100=8)],
            {"H100": 16},
            {},
            ["next"],
            [("never", R.GANG_LARGER_THAN_CLUSTER, 1)],
            id="a job that can never run does not hold up the line",
        ),
        pytest.param(
            [pending("x", 1, B200=8)],
            {"H100": 16},
            {},
            [],
            [("x", R.NO_CAPACITY_OF_TYPE, 1)],
            id="a type the cluster lacks",
        ),
    ],
)
def test_fifo_without_a_tenancy(jobs, capacity, in_use, admitted, waiting):
    result = admit(AdmissionSnapshot(jobs, capacity, in_use), AdmissionPolicy(), 0.0)
    assert result == AdmissionResult(
        admitted=[Admit(j) for j in admitted], waiting=[Waiting(*w) for w in waiting], preemptions=[]
    )


def test_old_style_results_and_policies_still_build():
    assert AdmissionResult([], []).preemptions == []
    assert AdmissionPolicy(max_admissions_per_cycle=5).tenancy is None
    assert AdmissionSnapshot([], {}, {}).running == []
