"""The job-log fold that tests and the simulator use to check the non-negotiables."""

from __future__ import annotations

import pytest

from trainyard.core.invariants import check_job_log
from trainyard.domain import JobSpec, Role
from trainyard.events import (
    JobAccepted,
    JobAdmitted,
    JobCancelled,
    JobPlaced,
    ReplicaPlacement,
    RunFailed,
    RunStarted,
    RunSucceeded,
)

SPEC = JobSpec(tenant="a", queue="q", roles=[Role(name="t", gpus_per_replica=2)], simulated_duration_s=1)


def accepted(job: str):
    return JobAccepted(at=0, job_id=job, spec=SPEC, submitted_at=0)


def admitted(job: str, run: str):
    return JobAdmitted(at=0, job_id=job, tenant="a", run_id=run, attempt=1)


def placed(job: str, run: str, node: str = "n1", gpus: tuple[int, ...] = (0, 1)):
    replica = ReplicaPlacement(role="t", replica=0, rank=0, node_id=node, gpus=list(gpus))
    return JobPlaced(at=0, job_id=job, tenant="a", run_id=run, cluster="c", replicas=[replica])


def started(job: str, run: str):
    return RunStarted(at=0, job_id=job, tenant="a", run_id=run)


def succeeded(job: str, run: str):
    return RunSucceeded(at=0, job_id=job, tenant="a", run_id=run)


def whole_life(job: str, run: str, gpus=(0, 1)):
    return [accepted(job), admitted(job, run), placed(job, run, gpus=gpus), started(job, run), succeeded(job, run)]


@pytest.mark.parametrize(
    ("events", "expected_violation"),
    [
        pytest.param(
            [*whole_life("a", "a1")[:4], *whole_life("b", "b1", gpus=(1, 2))[:3]],
            "GPU n1/1 given to b1 while held by a1",
            id="a GPU placed for a second run while the first still holds it is a violation",
        ),
        pytest.param(
            [*whole_life("a", "a1")[:4], started("a", "a1")],
            "run a1 started twice",
            id="a run reported started twice is a violation",
        ),
    ],
)
def test_violations_are_found(events, expected_violation) -> None:
    fold = check_job_log(events)
    assert any(expected_violation in v for v in fold.violations), fold.violations


@pytest.mark.parametrize(
    ("events", "final"),
    [
        pytest.param(
            [*whole_life("a", "a1"), *whole_life("b", "b1", gpus=(1, 2))],
            {"a": "succeeded", "b": "succeeded"},
            id="a GPU freed by a finished run may be given to the next run",
        ),
        pytest.param(
            [
                *whole_life("a", "a1")[:4],
                RunFailed(at=0, job_id="a", tenant="a", run_id="a1", reason="node_failure"),
                succeeded("a", "a1"),
                admitted("a", "a2"),
                placed("a", "a2", gpus=(0, 1)),
                started("a", "a2"),
                succeeded("a", "a2"),
            ],
            {"a": "succeeded"},
            id="a late success of a failed run counts for nothing and the retry succeeds once",
        ),
        pytest.param(
            [*whole_life("a", "a1")[:4], JobCancelled(at=0, job_id="a", tenant="a", run_id="a1"), succeeded("a", "a1")],
            {"a": "cancelled"},
            id="a success reported after a cancel does not revive the job",
        ),
    ],
)
def test_clean_logs_fold_to_their_final_status(events, final) -> None:
    fold = check_job_log(events)
    assert fold.violations == []
    assert fold.status == final
