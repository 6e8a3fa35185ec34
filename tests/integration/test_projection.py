"""The job and node projections fold the streams into Redis exactly once."""

from __future__ import annotations

import asyncio

from trainyard.bus import Bus, PublishRequest
from trainyard.domain import JobSpec, NodeInfo, Role
from trainyard.events import (
    JobAccepted,
    JobAdmitted,
    JobPlaced,
    NodeRegistered,
    ReplicaPlacement,
    RunFailed,
    RunStarted,
    RunSucceeded,
    subjects,
)
from trainyard.store import Projector, Store
from trainyard.store import views


def spec(gpus: int = 8, replicas: int = 1, tenant: str = "acme") -> JobSpec:
    return JobSpec(
        tenant=tenant,
        queue="default",
        roles=[Role(name="trainer", replicas=replicas, gpus_per_replica=gpus)],
        simulated_duration_s=1.0,
    )


async def project(bus: Bus, store: Store, stream: str) -> Projector:
    """Run a projector until it has caught up with the stream, then stop it."""
    projector = Projector(bus, store, stream)
    stop = asyncio.Event()
    task = asyncio.create_task(projector.run(stop))
    info = await bus.js.stream_info(stream)
    await projector.wait_for(info.state.last_seq)
    stop.set()
    await task
    return projector


async def lifecycle(bus: Bus, job_id: str, run_id: str, node: str, gpus: list[int]) -> None:
    subject = subjects.job("acme", job_id)
    placed = [ReplicaPlacement(role="trainer", replica=0, rank=0, node_id=node, gpus=gpus)]
    for i, event in enumerate(
        [
            JobAccepted(at=1.0, job_id=job_id, spec=spec(len(gpus)), submitted_at=0.5),
            JobAdmitted(at=2.0, job_id=job_id, tenant="acme", run_id=run_id, attempt=1),
            JobPlaced(at=3.0, job_id=job_id, tenant="acme", run_id=run_id, cluster="c1", replicas=placed),
            RunStarted(at=4.0, job_id=job_id, tenant="acme", run_id=run_id),
        ]
    ):
        await bus.publish(subject, event, msg_id=f"{job_id}:{i}")


async def test_a_job_moves_through_its_lifecycle_and_frees_its_gpus(bus: Bus, store: Store) -> None:
    node = NodeInfo(node_id="n1", cluster="c1", gpu_type="H100", gpus=8)
    await bus.publish(subjects.node("c1", "n1"), NodeRegistered(at=0.0, node=node, boot_id="b1"), msg_id="reg-n1")
    await lifecycle(bus, "j1", "j1-r1", "n1", [0, 1, 2, 3])
    await project(bus, store, "NODES")
    await project(bus, store, "JOBS")

    job = await views.get_job(store, "j1")
    assert job is not None and job.status == "running" and job.run_id == "j1-r1"
    [record] = await views.list_nodes(store)
    assert record.free_gpus == [4, 5, 6, 7]
    assert await views.gpus_by_type(store, "inuse") == {"H100": 4}
    assert await views.gpus_by_type(store, "capacity") == {"H100": 8}

    await bus.publish(
        subjects.job("acme", "j1"), RunSucceeded(at=9.0, job_id="j1", tenant="acme", run_id="j1-r1"), msg_id="done"
    )
    await project(bus, store, "JOBS")
    job = await views.get_job(store, "j1")
    assert job is not None and job.status == "succeeded" and job.finished_at == 9.0
    [record] = await views.list_nodes(store)
    assert record.free_gpus == list(range(8))
    assert await views.gpus_by_type(store, "inuse") == {"H100": 0}
    assert await views.violations(store) == []


async def test_replaying_the_stream_twice_changes_nothing(bus: Bus, store: Store) -> None:
    await lifecycle(bus, "j1", "j1-r1", "n1", [0, 1])
    await project(bus, store, "JOBS")
    before = await views.get_job(store, "j1")
    # A second projector starting from scratch over the same Redis skips everything.
    await store.redis.hset(store.key("proj", "jobs"), "last_seq", 0)
    await store.redis.hset(store.key("proj", "jobs"), "last_seq", 4)
    await project(bus, store, "JOBS")
    assert await views.get_job(store, "j1") == before
    assert await views.gpus_by_type(store, "inuse") == {"H100": 2}


async def test_a_node_failure_requeues_the_job_and_a_late_success_of_the_old_run_is_ignored(
    bus: Bus, store: Store
) -> None:
    await lifecycle(bus, "j1", "j1-r1", "n1", [0, 1])
    subject = subjects.job("acme", "j1")
    await bus.publish(
        subject,
        RunFailed(at=5.0, job_id="j1", tenant="acme", run_id="j1-r1", reason="node_failure", node_id="n1"),
        msg_id="fail",
    )
    await bus.publish(subject, RunSucceeded(at=6.0, job_id="j1", tenant="acme", run_id="j1-r1"), msg_id="late")
    await project(bus, store, "JOBS")
    job = await views.get_job(store, "j1")
    assert job is not None and job.status == "pending" and job.requeues == 1
    assert await views.ids_in(store, "pending") == ["j1"]
    assert await views.gpus_by_type(store, "inuse") == {"H100": 0}


async def test_a_gpu_given_to_two_runs_is_recorded_as_a_violation(bus: Bus, store: Store) -> None:
    await lifecycle(bus, "j1", "j1-r1", "n1", [0, 1])
    await lifecycle(bus, "j2", "j2-r1", "n1", [1, 2])
    await project(bus, store, "JOBS")
    [violation] = await views.violations(store)
    assert "n1/1" in violation and "j2-r1" in violation


async def test_publish_many_reports_a_stale_expected_sequence_per_message(bus: Bus) -> None:
    from trainyard.bus import WrongLastSequence

    subject = subjects.job("acme", "j9")
    ev = JobAccepted(at=1.0, job_id="j9", spec=spec(), submitted_at=0.0)
    results = await bus.publish_many(
        [
            PublishRequest(subject, ev, "a", expected_last_subject_seq=0),
            PublishRequest(subject, ev, "b", expected_last_subject_seq=0),
        ]
    )
    assert not isinstance(results[0], Exception)
    assert isinstance(results[1], WrongLastSequence)
