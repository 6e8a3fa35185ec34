"""The job and node projections fold the streams into Redis exactly once."""

from __future__ import annotations

import asyncio
import contextlib

import msgspec
import pytest
import redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from trainyard.bus import Bus, PublishRequest
from trainyard.core.lifecycle import JobTable
from trainyard.domain import JobSpec, NodeInfo, Role
from trainyard.domain.job import ValidationError
from trainyard.events import (
    CheckpointSaved,
    JobAccepted,
    JobAdmitted,
    JobPlaced,
    JobRejected,
    NodeRegistered,
    PreemptionNotice,
    ReplicaPlacement,
    RunFailed,
    RunStarted,
    RunSucceeded,
    decode_job_event,
    job_subject,
    subjects,
)
from trainyard.local.servers import Server
from trainyard.store import Projector, Store, bulk, job_hash, views, waiting
from trainyard.testing.publish import publish_event
from trainyard.testing.streams import read_raw


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
    placed = [ReplicaPlacement(role="trainer", replica=0, rank=0, node_id=node, gpus=gpus)]
    for i, event in enumerate(
        [
            JobAccepted(at=1.0, job_id=job_id, spec=spec(len(gpus)), submitted_at=0.5),
            JobAdmitted(at=2.0, job_id=job_id, tenant="acme", run_id=run_id, attempt=1),
            JobPlaced(at=3.0, job_id=job_id, tenant="acme", run_id=run_id, cluster="c1", replicas=placed),
            RunStarted(at=4.0, job_id=job_id, tenant="acme", run_id=run_id),
        ]
    ):
        await publish_event(bus, event, msg_id=f"{job_id}:{i}")


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

    await publish_event(bus, RunSucceeded(at=9.0, job_id="j1", tenant="acme", run_id="j1-r1"), msg_id="done")
    await project(bus, store, "JOBS")
    job = await views.get_job(store, "j1")
    assert job is not None and job.status == "succeeded" and job.finished_at == 9.0
    [record] = await views.list_nodes(store)
    assert record.free_gpus == list(range(8))
    assert await views.gpus_by_type(store, "inuse") == {"H100": 0}
    assert await views.violations(store) == []


async def test_a_jobs_tenant_is_read_alone_and_none_before_the_projection_has_it(bus: Bus, store: Store) -> None:
    assert await views.job_tenant(store, "j1") is None
    await lifecycle(bus, "j1", "j1-r1", "n1", [0, 1])
    await project(bus, store, "JOBS")
    assert await views.job_tenant(store, "j1") == "acme"
    await store.redis.hset(store.key("job", "j2"), "tenant", "acme")  # a hash without a status is no job
    assert await views.job_tenant(store, "j2") is None


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
    await publish_event(
        bus,
        RunFailed(at=5.0, job_id="j1", tenant="acme", run_id="j1-r1", reason="node_failure", node_id="n1"),
        msg_id="fail",
    )
    await publish_event(bus, RunSucceeded(at=6.0, job_id="j1", tenant="acme", run_id="j1-r1"), msg_id="late")
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

    ev = JobAccepted(at=1.0, job_id="j9", spec=spec(), submitted_at=0.0)
    subject = job_subject(ev)
    results = await bus.publish_many(
        [
            PublishRequest(subject, ev, "a", expected_last_subject_seq=0),
            PublishRequest(subject, ev, "b", expected_last_subject_seq=0),
        ]
    )
    assert not isinstance(results[0], Exception)
    assert isinstance(results[1], WrongLastSequence)


def failed(job_id: str, run_id: str, reason: str, at: float = 10.0) -> RunFailed:
    return RunFailed(at=at, job_id=job_id, tenant="acme", run_id=run_id, reason=reason)  # type: ignore[arg-type]


async def fail_runs(bus: Bus, store: Store, reasons: list[str], max_retries: int = 3) -> None:
    """Run job j1 and fail each of its attempts with the given reasons in turn."""
    s = msgspec.structs.replace(spec(2), max_retries=max_retries)
    await publish_event(bus, JobAccepted(at=1.0, job_id="j1", spec=s, submitted_at=0.5), msg_id="acc")
    for attempt, reason in enumerate(reasons, start=1):
        run = f"j1-r{attempt}"
        await publish_event(
            bus, JobAdmitted(at=2.0, job_id="j1", tenant="acme", run_id=run, attempt=attempt), msg_id=f"adm{attempt}"
        )
        await publish_event(bus, failed("j1", run, reason, at=100.0 * attempt), msg_id=f"fail{attempt}")
    await project(bus, store, "JOBS")


@pytest.mark.parametrize(
    ("reasons", "max_retries", "status", "not_before", "requeues"),
    [
        pytest.param(
            ["workload_error"], 3, "pending", 100.0 + 10.0, 0, id="a job's own failure is retried after a 10 s backoff"
        ),
        pytest.param(
            ["workload_error", "workload_error"],
            3,
            "pending",
            200.0 + 20.0,
            0,
            id="the backoff doubles with each failure of the job's own",
        ),
        pytest.param(
            ["workload_error", "workload_error"],
            1,
            "failed",
            None,
            0,
            id="a job that fails more often than it may retry fails for good",
        ),
        pytest.param(["node_failure"] * 5, 0, "pending", None, 5, id="node failures never use up the retry budget"),
        pytest.param(["preempted"], 0, "pending", None, 1, id="a preempted job is requeued at once"),
        pytest.param(
            ["placement_timeout", "placement_timeout"],
            0,
            "pending",
            200.0 + 10.0,
            0,
            id="a gang placement could not place waits out a growing backoff",
        ),
    ],
)
async def test_failed_runs_requeue_or_fail_the_job(
    bus: Bus, store: Store, reasons: list[str], max_retries: int, status: str, not_before: float | None, requeues: int
) -> None:
    await fail_runs(bus, store, reasons, max_retries)
    job = await views.get_job(store, "j1")
    assert job is not None
    assert (job.status, job.not_before, job.requeues) == (status, not_before, requeues)
    assert (await views.ids_in(store, "pending")) == (["j1"] if status == "pending" else [])
    assert await views.gpus_by_type(store, "inuse") == {"H100": 0}


async def test_a_node_failure_puts_the_job_ahead_of_jobs_that_never_ran(bus: Bus, store: Store) -> None:
    await publish_event(bus, JobAccepted(at=3.0, job_id="later", spec=spec(), submitted_at=3.0), msg_id="l")
    await fail_runs(bus, store, ["node_failure"])
    assert await views.ids_in(store, "pending") == ["j1", "later"]
    j1, later = await views.get_job(store, "j1"), await views.get_job(store, "later")
    assert j1 is not None and later is not None and j1.order < later.order


async def test_a_preemption_notice_and_checkpoints_are_recorded_for_the_current_run_only(
    bus: Bus, store: Store
) -> None:
    await lifecycle(bus, "j1", "j1-r1", "n1", [0, 1])
    notice = PreemptionNotice(
        at=5.0, job_id="j1", tenant="acme", run_id="j1-r1", preemptor="urgent", reason="priority", grace_period_s=30.0
    )
    await publish_event(bus, notice, msg_id="n")
    await publish_event(bus, CheckpointSaved(at=6.0, job_id="j1", tenant="acme", run_id="j1-r1", step=120), msg_id="c1")
    await publish_event(
        bus, CheckpointSaved(at=7.0, job_id="j1", tenant="acme", run_id="old-run", step=999), msg_id="c2"
    )
    await project(bus, store, "JOBS")
    job = await views.get_job(store, "j1")
    assert job is not None
    assert (job.status, job.preempt_deadline, job.last_checkpoint_step) == ("running", 35.0, 120)


async def test_a_backoff_from_an_epoch_time_keeps_every_digit(bus: Bus, store: Store) -> None:
    at = 1795970000.123456
    await publish_event(bus, JobAccepted(at=1.0, job_id="j1", spec=spec(2), submitted_at=0.5), msg_id="acc")
    await publish_event(bus, JobAdmitted(at=2.0, job_id="j1", tenant="acme", run_id="j1-r1", attempt=1), msg_id="adm")
    await publish_event(bus, failed("j1", "j1-r1", "workload_error", at=at), msg_id="fail")
    await project(bus, store, "JOBS")
    job = await views.get_job(store, "j1")
    assert job is not None and job.not_before == at + 10.0


async def test_an_event_whose_subject_disagrees_with_its_body_is_not_folded(bus: Bus, store: Store) -> None:
    """A credential that may write only node-agent events cannot pass off a
    placement, and no event lands on another tenant's or another job's record."""
    await lifecycle(bus, "j1", "j1-r1", "n1", [0, 1])
    forged = [
        # A placement sent on the node agents' subject.
        (
            JobPlaced(
                at=5.0,
                job_id="j1",
                tenant="acme",
                run_id="j1-r1",
                cluster="c1",
                replicas=[ReplicaPlacement(role="trainer", replica=0, rank=0, node_id="n1", gpus=[6, 7])],
            ),
            subjects.job("acme", "j1", "agent"),
        ),
        # A success for acme's job sent under tenant beta's subject.
        (RunSucceeded(at=6.0, job_id="j1", tenant="acme", run_id="j1-r1"), subjects.job("beta", "j1", "agent")),
        # A success for j1 filed under another job's subject.
        (RunSucceeded(at=6.0, job_id="j1", tenant="acme", run_id="j1-r1"), subjects.job("acme", "j2", "agent")),
    ]
    for i, (event, subject) in enumerate(forged):
        await bus.publish(subject, event, msg_id=f"forged-{i}")
    projector = await project(bus, store, "JOBS")

    job = await views.get_job(store, "j1")
    assert job is not None and job.status == "running"
    assert [r.gpus for r in job.placement] == [[0, 1]]
    assert await views.get_job(store, "j2") is None
    assert projector.position == (await bus.js.stream_info("JOBS")).state.last_seq  # nothing stalled on them


def test_subject_checks_name_the_disagreement() -> None:
    from trainyard.events import subject_disagrees

    ok = RunSucceeded(at=1.0, job_id="j1", tenant="acme", run_id="r1")
    assert subject_disagrees(subjects.job("acme", "j1", "agent"), ok) is None
    assert "may not be written by 'health'" in (subject_disagrees(subjects.job("acme", "j1", "health"), ok) or "")
    assert subject_disagrees(subjects.job("acme", "j1", "placement"), ok) is None  # the run dispatcher
    assert "sent on" in (subject_disagrees(subjects.job("beta", "j1", "agent"), ok) or "")
    assert "not a job subject" in (subject_disagrees("trainyard.jobs.acme.j1", ok) or "")
    failed = RunFailed(at=1.0, job_id="j1", tenant="acme", run_id="r1", reason="node_failure")
    assert all(
        subject_disagrees(subjects.job("acme", "j1", w), failed) is None
        for w in ("agent", "placement", "health", "admission")
    )


async def test_a_deep_backlog_in_one_queue_does_not_hide_another_queues_jobs_from_admission(
    bus: Bus, store: Store
) -> None:
    for i in range(30):
        await publish_event(
            bus,
            JobAccepted(at=1.0, job_id=f"deep-{i:02d}", spec=spec(tenant="deep"), submitted_at=0.5),
            msg_id=f"deep-{i}",
        )
    for i in range(2):
        await publish_event(
            bus,
            JobAccepted(at=2.0, job_id=f"late-{i}", spec=spec(tenant="stream"), submitted_at=1.5),
            msg_id=f"late-{i}",
        )
    await project(bus, store, "JOBS")

    everything = await views.pending_window(store, 100)
    shared = await views.pending_window(store, 10)

    assert everything == [f"deep-{i:02d}" for i in range(30)] + ["late-0", "late-1"]  # all of them, oldest first
    assert shared == [f"deep-{i:02d}" for i in range(5)] + ["late-0", "late-1"]  # each queue's oldest, in order


# --- the job hash as readers decode it ------------------------------------------------------------


async def test_a_job_hash_written_by_the_lua_fold_decodes_to_the_record_the_lifecycle_fold_computes(
    bus: Bus, store: Store
) -> None:
    await lifecycle(bus, "j1", "j1-r1", "n1", [0, 1])
    for i, event in enumerate(
        [
            CheckpointSaved(at=5.5, job_id="j1", tenant="acme", run_id="j1-r1", step=40),
            failed("j1", "j1-r1", "workload_error", at=1795970000.25),
            JobAdmitted(at=1795970020.0, job_id="j1", tenant="acme", run_id="j1-r2", attempt=2),
            PreemptionNotice(
                at=1795970030.0,
                job_id="j1",
                tenant="acme",
                run_id="j1-r2",
                preemptor="urgent",
                reason="priority",
                grace_period_s=30.0,
            ),
        ]
    ):
        await publish_event(bus, event, msg_id=f"more-{i}")
    await publish_event(
        bus, JobRejected(at=2.0, job_id="bad", tenant="acme", errors=[ValidationError("roles", "none")]), msg_id="bad"
    )
    await project(bus, store, "JOBS")
    table = JobTable()
    for seq, _, data in await read_raw(bus, "JOBS"):
        table.apply(decode_job_event(data), seq)

    for job_id in ("j1", "bad"):
        decoded = job_hash.decode_job(job_id, await store.redis.hgetall(store.key("job", job_id)))
        assert decoded == table.jobs[job_id]
        assert await views.get_job(store, job_id) == decoded
    j1 = table.jobs["j1"]
    assert (j1.status, j1.run_id, j1.failures, j1.message, j1.preemptor) == ("admitted", "j1-r2", 1, "", "urgent")
    assert j1.job_spec == spec(2)
    assert job_hash.decode_job("j1", {"run_id": "j1-r2"}) is None  # no status: no job


async def test_a_reader_that_reads_some_fields_gets_them_decoded_by_the_same_decoder(bus: Bus, store: Store) -> None:
    await lifecycle(bus, "j1", "j1-r1", "n1", [0, 1])
    await project(bus, store, "JOBS")
    whole = await views.get_job(store, "j1")

    [some] = await views.get_jobs(store, ["j1", "nobody"], fields=("run_id", "placed_at", "placement"))

    assert whole is not None
    assert (some.status, some.tenant, some.order, some.last_seq) == (whole.status, whole.tenant, whole.order, 4)
    assert (some.run_id, some.placed_at, some.placement) == ("j1-r1", 3.0, whole.placement)
    assert some.spec is None and some.submitted_at is None  # not read
    with pytest.raises(ValueError, match="not fields of a job hash"):
        await views.get_jobs(store, ["j1"], fields=("position",))


async def running_jobs(bus: Bus, store: Store, count: int, chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Jobs j0..j<count-1> running, projected; readers read ``chunk`` jobs per script call."""
    monkeypatch.setattr(views, "_CHUNK", chunk)
    for i in range(count):
        await lifecycle(bus, f"j{i}", f"j{i}-r1", "n1", [i])
    await project(bus, store, "JOBS")


async def test_a_read_of_many_jobs_in_chunks_gives_each_record_in_order(
    bus: Bus, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Chunks of two: each chunk's call is in the server while the one before is decoded.
    await running_jobs(bus, store, 5, chunk=2, monkeypatch=monkeypatch)
    ids = ["j3", "nobody", "j0", "j4", "j1", "gone", "j2"]
    fields = ("run_id", "placement", "spec")

    chunked = await views.get_jobs(store, ids, fields)
    alone = [job for j in ids if (job := await views.get_job(store, j, fields)) is not None]
    whole = [job for j in ids if (job := await views.get_job(store, j)) is not None]

    assert [j.job_id for j in chunked] == ["j3", "j0", "j4", "j1", "j2"]
    assert chunked == alone
    assert [(j.run_id, j.placement, j.job_spec) for j in chunked] == [
        (j.run_id, j.placement, j.job_spec) for j in whole
    ]


async def test_a_chunk_that_cannot_be_read_fails_the_read_and_leaves_no_reply_for_a_later_command(
    bus: Bus, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    await running_jobs(bus, store, 3, chunk=1, monkeypatch=monkeypatch)
    await store.redis.hset(store.key("job", "j0"), "order", "first")  # j0's row fails to decode...

    with pytest.raises(ValueError, match="first"):
        await views.get_jobs(store, ["j0", "j1", "j2"], ("run_id",))  # ... while j1's call is in the server

    # j1's reply, sent for the failed read, is read by no later command: each gets its own.
    for job_id in ("j2", "j1", "j2"):
        assert await store.redis.hget(store.key("job", job_id), "run_id") == f"{job_id}-r1"
    assert [j.job_id for j in await views.get_jobs(store, ["j1", "j2"], ("run_id",))] == ["j1", "j2"]
    await store.redis.set(store.key("job", "j1"), "not a hash")  # a reply that is an error in the server
    with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
        await views.get_jobs(store, ["j2", "j1"], ("run_id",))
    assert await store.redis.hget(store.key("job", "j2"), "run_id") == "j2-r1"


async def test_a_read_of_many_jobs_cancelled_midway_leaves_every_connection_usable(
    bus: Bus, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    await running_jobs(bus, store, 4, chunk=1, monkeypatch=monkeypatch)
    ids = [f"j{i}" for i in range(4)]
    read = asyncio.create_task(views.get_jobs(store, ids * 100, ("run_id",)))  # 400 calls, one at a time
    assert await store.redis.ping()  # meanwhile the read gets under way, on a connection of its own
    read.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await read

    for job_id in ids:
        assert await store.redis.hget(store.key("job", job_id), "run_id") == f"{job_id}-r1"
    assert [j.run_id for j in await views.get_jobs(store, ids, ("run_id",))] == [f"{j}-r1" for j in ids]


async def test_a_read_of_many_jobs_whose_connection_is_cut_midway_starts_over_when_the_client_retries(
    bus: Bus, store: Store, redis_server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    await running_jobs(bus, store, 3, chunk=1, monkeypatch=monkeypatch)
    keys = [[store.key("job", j)] for j in ("j0", "j1", "j2")]
    admin = redis.Redis.from_url(redis_server.url, decode_responses=True)
    decoded: list[int] = []

    def decode(k: int, rows: list) -> str:
        decoded.append(k)
        if decoded == [0]:  # chunk 1's call is out: cut the read's connection in the server
            for client in admin.client_list():
                if client["cmd"] == "eval":
                    admin.client_kill_filter(_id=client["id"])
        return rows[0][0]

    retrying = Store.from_url(redis_server.url, store.prefix, retry=Retry(NoBackoff(), 2))
    try:
        assert await bulk.read_chunks(retrying, keys, ["run_id"], decode) == ["j0-r1", "j1-r1", "j2-r1"]
        assert decoded.count(0) == 2 and decoded[-3:] == [0, 1, 2]  # it started over from the first chunk
        decoded.clear()
        with pytest.raises(redis.exceptions.ConnectionError):  # a client without retries gets the error
            await bulk.read_chunks(store, keys, ["run_id"], decode)
    finally:
        await retrying.close()
        admin.close()


async def test_the_projection_stores_a_spec_as_the_accepting_event_carried_it(bus: Bus, store: Store) -> None:
    # JSON as another producer might write it: its own key order and spacing, a field this version does not know.
    carried = (
        b'{ "queue": "default", "tenant": "acme", "roles": [ {"name": "trainer", "gpus_per_replica": 2} ],'
        b' "simulated_duration_s": 1.0, "from_a_newer_version": [1, 2] }'
    )
    message = b'{"type": "JobAccepted", "at": 1.0, "job_id": "j1", "submitted_at": 0.5, "spec": ' + carried + b"}"
    await bus.js.publish(subjects.job("acme", "j1", "admission"), message, headers={"Nats-Msg-Id": "j1"})
    await project(bus, store, "JOBS")

    assert (await store.redis.hget(store.key("job", "j1"), "spec")).encode() == carried
    job = await views.get_job(store, "j1")
    assert job is not None and job.job_spec == spec(2)
    assert await store.redis.hget(store.key("job", "j1"), "gpus_by_type") == '{"H100": 2}'


async def test_the_fold_forgets_why_a_job_waited_as_its_status_changes(bus: Bus, store: Store) -> None:
    placed = [ReplicaPlacement(role="trainer", replica=0, rank=0, node_id="n1", gpus=[0, 1])]
    steps = [
        ("pending", JobAccepted(at=1.0, job_id="j1", spec=spec(2), submitted_at=0.5)),
        ("admitted", JobAdmitted(at=2.0, job_id="j1", tenant="acme", run_id="j1-r1", attempt=1)),
        ("placed", JobPlaced(at=3.0, job_id="j1", tenant="acme", run_id="j1-r1", cluster="c1", replicas=placed)),
    ]
    for i, (status, event) in enumerate(steps):
        await publish_event(bus, event, msg_id=f"step-{i}")
        await project(bus, store, "JOBS")
        job = await views.get_job(store, "j1")
        assert job is not None and job.status == status
        assert await store.redis.hlen(store.key("why", "pending")) == 0
        assert await store.redis.hlen(store.key("why", "admitted")) == 0
        if status in waiting.WAITING:  # what the decider of this status says about it
            await waiting.write(store, status, {"j1": waiting.Waiting("quota_exhausted", 1, 5.0)})
    assert set(await store.redis.hkeys(store.key("job", "j1"))) <= set(job_hash.FIELDS)


async def test_a_projection_goes_on_after_redis_forgets_its_scripts(bus: Bus, store: Store) -> None:
    """The fold runs by SHA; a Redis whose script cache was flushed (restarted
    with its data, or SCRIPT FLUSH) gets the script again, and nothing is
    folded twice."""
    node = NodeInfo(node_id="n1", cluster="c1", gpu_type="H100", gpus=8)
    await bus.publish(subjects.node("c1", "n1"), NodeRegistered(at=0.0, node=node, boot_id="b1"), msg_id="reg-n1")
    await project(bus, store, "NODES")
    await lifecycle(bus, "j1", "j1-r1", "n1", [0, 1])
    await project(bus, store, "JOBS")
    await store.redis.script_flush()
    await lifecycle(bus, "j2", "j2-r1", "n1", [2, 3, 4])
    projector = await project(bus, store, "JOBS")

    assert [await store.redis.script_exists(store._apply_job.sha)] == [[True]]
    jobs = {j.job_id: j.status for j in await views.list_jobs(store)}
    assert jobs == {"j1": "running", "j2": "running"}
    [record] = await views.list_nodes(store)
    assert record.free_gpus == [5, 6, 7]
    assert projector.position == (await bus.js.stream_info("JOBS")).state.last_seq
