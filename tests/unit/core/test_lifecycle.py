"""The lifecycle fold: one job's record, event by event, and the GPU holders."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from trainyard.core.lifecycle import HEAD_OF_QUEUE_OFFSET, JobRecord, JobTable, apply
from trainyard.domain import JobSpec, Role
from trainyard.events import (
    CheckpointSaved,
    JobAccepted,
    JobAdmitted,
    JobCancelled,
    JobPlaced,
    JobRejected,
    PreemptionNotice,
    ReplicaPlacement,
    RunFailed,
    RunStarted,
    RunSucceeded,
)


def spec(max_retries: int = 1, gpus: int = 2) -> JobSpec:
    roles = [Role(name="t", gpus_per_replica=gpus, gpu_type="H100")]
    return JobSpec(tenant="a", queue="q", roles=roles, max_retries=max_retries, simulated_duration_s=1)


def accepted(job: str = "j", max_retries: int = 1, at: float = 1.0) -> JobAccepted:
    return JobAccepted(at=at, job_id=job, spec=spec(max_retries), submitted_at=0.5)


def admitted(run: str, job: str = "j", at: float = 2.0) -> JobAdmitted:
    return JobAdmitted(at=at, job_id=job, tenant="a", run_id=run, attempt=int(run[-1]))


def placed(run: str, job: str = "j", node: str = "n1", gpus: tuple[int, ...] = (0, 1)) -> JobPlaced:
    replica = ReplicaPlacement(role="t", replica=0, rank=0, node_id=node, gpus=list(gpus))
    return JobPlaced(at=3.0, job_id=job, tenant="a", run_id=run, cluster="c", replicas=[replica])


def started(run: str, job: str = "j") -> RunStarted:
    return RunStarted(at=4.0, job_id=job, tenant="a", run_id=run)


def succeeded(run: str, job: str = "j", at: float = 9.0) -> RunSucceeded:
    return RunSucceeded(at=at, job_id=job, tenant="a", run_id=run)


def failed(run: str, reason: str, at: float = 100.0, job: str = "j") -> RunFailed:
    return RunFailed(at=at, job_id=job, tenant="a", run_id=run, reason=reason, message="m")  # type: ignore[arg-type]


def cancelled(run: str | None = None, job: str = "j") -> JobCancelled:
    return JobCancelled(at=50.0, job_id=job, tenant="a", run_id=run, reason="user")


def running(run: str = "j-r1", job: str = "j") -> list[Any]:
    return [admitted(run, job), placed(run, job), started(run, job)]


def fold(events: list[Any]) -> JobRecord | None:
    record = None
    for seq, event in enumerate(events, start=1):
        record = apply(record, event, seq).record
    return record


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        pytest.param(
            [accepted()],
            {
                "status": "pending",
                "order": 1,
                "gpus": 2,
                "gpus_by_type": {"H100": 2},
                "max_retries": 1,
                "accepted_at": 1.0,
            },
            id="an accepted job waits in its queue, ordered by its accept sequence",
        ),
        pytest.param(
            [accepted(), accepted(at=7.0)],
            {"status": "pending", "accepted_at": 1.0, "last_seq": 2},
            id="a second acceptance changes nothing but the subject's last sequence",
        ),
        pytest.param(
            [accepted(), JobRejected(at=5.0, job_id="j", tenant="a", errors=[])],
            {"status": "pending", "finished_at": None},
            id="a rejection of an accepted job changes nothing",
        ),
        pytest.param(
            [accepted(), *running()],
            {"status": "running", "run_id": "j-r1", "attempt": 1, "placed_at": 3.0, "started_at": 4.0, "cluster": "c"},
            id="an admitted, placed and started job is running under its run",
        ),
        pytest.param(
            [accepted(), admitted("j-r1"), started("j-r1")],
            {"status": "admitted", "started_at": None, "last_seq": 3},
            id="a start before the placement is ignored",
        ),
        pytest.param(
            [accepted(), admitted("j-r1"), placed("j-r9")],
            {"status": "admitted", "placement": ()},
            id="a placement for a run other than the current one is ignored",
        ),
        pytest.param(
            [accepted(), *running(), admitted("j-r2")],
            {"status": "running", "run_id": "j-r1"},
            id="an admission of a job that is not pending is ignored",
        ),
        pytest.param(
            [accepted(), *running(), failed("j-r1", "node_failure"), succeeded("j-r1")],
            {"status": "pending", "finished_at": None, "requeues": 1, "reason": "node_failure"},
            id="a success of an old run after a node failure changes nothing",
        ),
        pytest.param(
            [accepted(), *running(), failed("j-r1", "node_failure")],
            {"status": "pending", "order": 1 - HEAD_OF_QUEUE_OFFSET, "placement": (), "not_before": None},
            id="a node failure puts the job ahead of every job that never ran",
        ),
        pytest.param(
            [accepted(), *running(), failed("j-r1", "lost"), *running("j-r2"), failed("j-r2", "node_failure")],
            {"status": "pending", "order": 1 - HEAD_OF_QUEUE_OFFSET, "requeues": 2, "failures": 0},
            id="a second node failure keeps the place the first one gave",
        ),
        pytest.param(
            [accepted(), *running(), failed("j-r1", "preempted")],
            {"status": "pending", "order": 1, "requeues": 1, "not_before": None},
            id="a preempted job keeps its place and waits for nothing",
        ),
        pytest.param(
            [
                accepted(),
                admitted("j-r1"),
                failed("j-r1", "placement_timeout", at=100.0),
                admitted("j-r2"),
                failed("j-r2", "placement_timeout", at=200.0),
            ],
            {"status": "pending", "order": 1, "timeouts": 2, "requeues": 0, "not_before": 210.0},
            id="a gang placement could not place keeps its place after a doubling backoff",
        ),
        pytest.param(
            [accepted(max_retries=1), *running(), failed("j-r1", "workload_error", at=100.5)],
            {"status": "pending", "failures": 1, "not_before": 110.5, "message": "m"},
            id="a job's own failure is retried after a backoff",
        ),
        pytest.param(
            [
                accepted(max_retries=1),
                *running(),
                failed("j-r1", "workload_error"),
                *running("j-r2"),
                failed("j-r2", "timeout", at=300.0),
            ],
            {"status": "failed", "failures": 2, "finished_at": 300.0},
            id="a job that fails more often than it may retry fails for good",
        ),
        pytest.param(
            [accepted(), *running(), failed("j-r1", "workload_error"), admitted("j-r2", at=120.0)],
            {"status": "admitted", "not_before": None, "reason": None, "started_at": None, "placed_at": None},
            id="a new run starts with no backoff, failure reason or times of the old one",
        ),
        pytest.param(
            [accepted(), *running(), cancelled("j-r0")],
            {"status": "cancelled", "finished_at": 50.0, "reason": "user"},
            id="a cancel ends the job whatever run it names",
        ),
        pytest.param(
            [accepted(), *running(), succeeded("j-r1"), cancelled()],
            {"status": "succeeded", "finished_at": 9.0, "reason": None},
            id="a cancel after the job ended changes nothing",
        ),
        pytest.param(
            [
                accepted(),
                *running(),
                PreemptionNotice(
                    at=5.0, job_id="j", tenant="a", run_id="j-r1", preemptor="u", reason="priority", grace_period_s=30.0
                ),
            ],
            {"notice_at": 5.0, "preempt_deadline": 35.0, "preemptor": "u", "preempt_reason": "priority"},
            id="a preemption notice for the current run is recorded with its deadline",
        ),
        pytest.param(
            [
                accepted(),
                *running(),
                PreemptionNotice(
                    at=5.0, job_id="j", tenant="a", run_id="j-r1", preemptor="u", reason="priority", grace_period_s=30.0
                ),
                failed("j-r1", "preempted"),
            ],
            {"notice_at": None, "preempt_deadline": None, "preemptor": None},
            id="the end of the run clears its preemption notice",
        ),
        pytest.param(
            [
                accepted(),
                *running(),
                CheckpointSaved(at=6.0, job_id="j", tenant="a", run_id="j-r1", step=7),
                CheckpointSaved(at=7.0, job_id="j", tenant="a", run_id="old", step=99),
            ],
            {"last_checkpoint_at": 6.0, "last_checkpoint_step": 7},
            id="a checkpoint of an old run is not recorded",
        ),
    ],
)
def test_the_fold_of_one_job(events: list[Any], expected: dict[str, Any]) -> None:
    record = fold(events)
    assert record is not None
    got = msgspec.structs.asdict(record)
    assert {k: got[k] for k in expected} == expected


@pytest.mark.parametrize(
    "event",
    [
        pytest.param(admitted("j-r1"), id="an admission of a job never accepted creates nothing"),
        pytest.param(cancelled(), id="a cancel of a job never accepted creates nothing"),
        pytest.param(succeeded("j-r1"), id="a success of a job never accepted creates nothing"),
    ],
)
def test_events_about_an_unknown_job_create_nothing(event: Any) -> None:
    assert apply(None, event, 1) == (None, False)


def test_a_sequence_folded_before_is_not_folded_again() -> None:
    record = fold([accepted(), admitted("j-r1")])
    assert apply(record, failed("j-r1", "node_failure"), 2) == (record, False)


def test_an_event_fenced_out_moves_only_the_last_sequence() -> None:
    record = fold([accepted(), *running()])
    assert record is not None
    after, applied = apply(record, succeeded("j-r0"), 10)
    assert not applied and after == msgspec.structs.replace(record, last_seq=10)


def table(events: list[Any]) -> JobTable:
    t = JobTable()
    for seq, event in enumerate(events, start=1):
        t.apply(event, seq)
    return t


@pytest.mark.parametrize(
    ("events", "holders", "violations"),
    [
        pytest.param(
            [
                accepted("a"),
                *running("a-r1", "a"),
                accepted("b"),
                admitted("b-r1", "b"),
                placed("b-r1", "b", gpus=(1, 2)),
            ],
            {("n1", 0): "a-r1", ("n1", 1): "b-r1", ("n1", 2): "b-r1"},
            ["seq 7: GPU n1/1 given to b-r1 while held by a-r1"],
            id="a GPU given to a second run while the first holds it is a violation",
        ),
        pytest.param(
            [
                accepted("a"),
                *running("a-r1", "a"),
                succeeded("a-r1", "a"),
                accepted("b"),
                admitted("b-r1", "b"),
                placed("b-r1", "b", gpus=(1, 2)),
            ],
            {("n1", 1): "b-r1", ("n1", 2): "b-r1"},
            [],
            id="a GPU freed by a finished run may go to the next run",
        ),
        pytest.param(
            [
                accepted("a"),
                *running("a-r1", "a"),
                accepted("b"),
                admitted("b-r1", "b"),
                placed("b-r1", "b", gpus=(1,)),
                failed("a-r1", "node_failure", job="a"),
            ],
            {("n1", 1): "b-r1"},
            ["seq 7: GPU n1/1 given to b-r1 while held by a-r1"],
            id="a run that lost its GPU to another gives back only what it still holds",
        ),
        pytest.param(
            [
                accepted("a"),
                *running("a-r1", "a"),
                failed("a-r1", "preempted", job="a"),
                succeeded("a-r1", "a"),
                cancelled(job="a"),
            ],
            {},
            [],
            id="a requeued job holds no GPU, and late events of its old run take none",
        ),
    ],
)
def test_gpu_holders_across_jobs(events: list[Any], holders: dict[tuple[str, int], str], violations: list[str]) -> None:
    t = table(events)
    assert t.holders.by_gpu == holders
    assert t.holders.violations == violations
