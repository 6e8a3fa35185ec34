"""The Redis projection's Lua fold equals the lifecycle fold in the core.

Random JOBS streams (several jobs sharing two nodes, duplicates, events of
stale runs, illegal transitions, redelivered sequences) are applied one
event at a time through the projector's code path into a real Redis and
through :class:`trainyard.core.lifecycle.JobTable`; then every job hash is
read back through the readers' decoder and compared with the Python record
field by field (so the record every reader gets is the fold's), and the
indexes, GPU holders and violations with what the records imply.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from trainyard.core.lifecycle import ACTIVE, JobRecord, JobTable
from trainyard.domain import JobSpec, Role
from trainyard.domain.job import ValidationError
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
from trainyard.events.codec import encode
from trainyard.local.servers import Server
from trainyard.store import Projector, Store, job_hash, views

JOBS = ("j0", "j1", "j2")
NODES = ("n0", "n1")
GPUS_PER_NODE = 4
REASONS = ("node_failure", "lost", "preempted", "placement_timeout", "workload_error", "timeout")
KINDS = (
    "accepted",
    "rejected",
    "admitted",
    "placed",
    "started",
    "succeeded",
    "failed",
    "cancelled",
    "notice",
    "checkpoint",
    "republish",
    "redeliver",
)

# What usually comes next for a job in each status, drawn besides any kind at all.
LIKELY = {
    None: ["accepted"] * 8,
    "pending": ["admitted"] * 8,
    "admitted": ["placed"] * 6 + ["failed"],
    "placed": ["started"] * 6 + ["failed"],
    "running": ["failed"] * 3 + ["succeeded", "notice", "checkpoint"] * 2,
}

# Times with fractions and epoch-sized values, so a stored number must keep every digit.
TIMES = st.one_of(
    st.sampled_from([0.0, 10.0, 1795970000.123456]),
    st.floats(min_value=0.0, max_value=2e9, allow_nan=False, allow_infinity=False),
)


# --- drawing a stream ---------------------------------------------------------


def spec_for(data: st.DataObject, job: str) -> JobSpec:
    roles = [
        Role(
            name=f"r{i}",
            replicas=data.draw(st.integers(1, 2)),
            gpus_per_replica=data.draw(st.integers(1, 4)),
            gpu_type=data.draw(st.sampled_from(["H100", "A100"])),
        )
        for i in range(data.draw(st.integers(1, 2)))
    ]
    return JobSpec(
        tenant=data.draw(st.sampled_from(["acme", "beta"])),
        queue="q",
        roles=roles,
        name=job,
        max_retries=data.draw(st.integers(0, 2)),
        simulated_duration_s=1.0,
    )


def replicas(data: st.DataObject) -> list[ReplicaPlacement]:
    out = []
    for rank in range(data.draw(st.integers(1, 2))):
        gpus = data.draw(st.lists(st.integers(0, GPUS_PER_NODE - 1), min_size=1, max_size=3, unique=True))
        node = data.draw(st.sampled_from(NODES))
        out.append(ReplicaPlacement(role="r0", replica=rank, rank=rank, node_id=node, gpus=gpus))
    return out


def draw_event(data: st.DataObject, table: JobTable) -> Any:
    """One event, mostly about the current run of a job (so lifecycles get far)."""
    job = data.draw(st.sampled_from(JOBS))
    record = table.jobs.get(job)
    pool = [f"{job}-r{k}" for k in (1, 2, 3, 4)]
    current = record.run_id if record is not None and record.run_id else None
    fresh = [r for r in pool if r != current] * 3  # admission mostly names a new run
    run = data.draw(st.sampled_from([current] * 4 + pool if current else pool))
    status = record.status if record is not None else None
    kind = data.draw(st.sampled_from(LIKELY.get(status, []) + list(KINDS[:-2])))
    at = data.draw(TIMES)
    tenant = record.tenant if record is not None else "acme"
    if kind == "accepted":
        return JobAccepted(at=at, job_id=job, spec=spec_for(data, job), submitted_at=data.draw(TIMES))
    if kind == "rejected":
        return JobRejected(at=at, job_id=job, tenant=tenant, errors=[ValidationError(field="roles", message="none")])
    if kind == "admitted":
        new_run, attempt = data.draw(st.sampled_from(fresh + pool)), data.draw(st.integers(1, 5))
        return JobAdmitted(at=at, job_id=job, tenant=tenant, run_id=new_run, attempt=attempt)
    if kind == "placed":
        return JobPlaced(at=at, job_id=job, tenant=tenant, run_id=run, cluster="c1", replicas=replicas(data))
    if kind == "started":
        return RunStarted(at=at, job_id=job, tenant=tenant, run_id=run)
    if kind == "succeeded":
        return RunSucceeded(at=at, job_id=job, tenant=tenant, run_id=run)
    if kind == "failed":
        reason = data.draw(st.sampled_from(REASONS))
        message = data.draw(st.sampled_from(["", "oom"]))
        return RunFailed(at=at, job_id=job, tenant=tenant, run_id=run, reason=reason, message=message)
    if kind == "cancelled":
        return JobCancelled(
            at=at, job_id=job, tenant=tenant, run_id=data.draw(st.sampled_from([None, run])), reason="user"
        )
    if kind == "notice":
        return PreemptionNotice(
            at=at,
            job_id=job,
            tenant=tenant,
            run_id=run,
            preemptor="urgent",
            reason="priority",
            grace_period_s=data.draw(st.sampled_from([30.0, 0.1])),
        )
    return CheckpointSaved(at=at, job_id=job, tenant=tenant, run_id=run, step=data.draw(st.integers(0, 10**6)))


def draw_stream(data: st.DataObject, table: JobTable, length: int) -> list[tuple[int, Any, bool]]:
    """``(seq, event, applied)`` as the Python fold applied them, in order.

    Besides fresh events: ``republish`` puts an earlier event on the stream
    again under a new sequence (a producer that published twice), and
    ``redeliver`` hands the projection an earlier sequence again."""
    stream: list[tuple[int, Any, bool]] = []
    seq = 0
    for _ in range(length):
        step = data.draw(st.sampled_from(("event",) * 6 + ("republish", "redeliver"))) if stream else "event"
        if step == "redeliver":
            old_seq, event, _ = data.draw(st.sampled_from(stream))
            stream.append((old_seq, event, table.apply(event, old_seq)))
            continue
        event = data.draw(st.sampled_from(stream))[1] if step == "republish" else draw_event(data, table)
        seq += 1
        stream.append((seq, event, table.apply(event, seq)))
    return stream


# --- reading Redis back -------------------------------------------------------


HASH_FIELDS = set(job_hash.FIELDS)


def differences(redis: JobRecord, python: JobRecord) -> dict[str, tuple[Any, Any]]:
    a, b = msgspec.structs.asdict(redis), msgspec.structs.asdict(python)
    return {k: (a[k], b[k]) for k in a if a[k] != b[k]}


async def zset(store: Store, name: str) -> dict[str, float]:
    return dict(await store.redis.zrange(store.key(name), 0, -1, withscores=True))


async def check_equal(store: Store, table: JobTable) -> None:
    r = store.redis
    # Every job hash, field by field.
    for job_id in JOBS:
        h = await r.hgetall(store.key("job", job_id))
        record = table.jobs.get(job_id)
        assert bool(h) == (record is not None), (job_id, h, record)
        if record is not None:
            assert set(h) <= HASH_FIELDS, set(h) - HASH_FIELDS
            decoded = job_hash.decode_job(job_id, h)
            assert decoded is not None and differences(decoded, record) == {}, job_id
    # The same records read field by field (HMGET rows, decoded column by column), in order, no job left out.
    rows = await views.get_jobs(store, list(JOBS), job_hash.FIELDS)
    assert [j.job_id for j in rows] == [j for j in JOBS if j in table.jobs]
    for row in rows:
        assert differences(row, table.jobs[row.job_id]) == {}, row.job_id
    jobs = table.jobs
    assert int(await r.hget(store.key("proj", "jobs"), "last_seq") or 0) == table.last_seq
    # Indexes over jobs.
    counts = {k: int(v) for k, v in (await r.hgetall(store.key("counts"))).items() if int(v)}
    assert counts == dict(Counter(rec.status for rec in jobs.values()))
    assert await zset(store, "pending") == {j: rec.order for j, rec in jobs.items() if rec.status == "pending"}
    by_queue: dict[str, dict[str, int]] = {}
    for j, rec in jobs.items():
        if rec.status == "pending":
            by_queue.setdefault(f"{rec.tenant}/{rec.queue}", {})[j] = rec.order
    assert set(await r.smembers(store.key("pendingqueues"))) == set(by_queue)
    for queue, members in by_queue.items():
        assert await zset(store, f"pendingq:{queue}") == members
    assert await zset(store, "admitted") == {j: rec.order for j, rec in jobs.items() if rec.status == "admitted"}
    assert await zset(store, "active") == {j: rec.order for j, rec in jobs.items() if rec.status in ACTIVE}
    assert set(await zset(store, "jobs")) == set(jobs)
    for tenant in ("acme", "beta"):
        assert set(await zset(store, f"tenant:{tenant}")) == {j for j, rec in jobs.items() if rec.tenant == tenant}
    in_use: Counter[str] = Counter()
    for rec in jobs.values():
        if rec.status in ACTIVE:
            in_use.update(rec.gpus_by_type)
    held = {k: int(v) for k, v in (await r.hgetall(store.key("inuse"))).items() if int(v)}
    assert held == {t: n for t, n in in_use.items() if n}
    # GPU holders: the alloc hashes, the GPU map and the runs on each node.
    gpumap = await r.hgetall(store.key("gpumap"))
    for node in NODES:
        alloc = {(node, int(g)): run for g, run in (await r.hgetall(store.key("alloc", node))).items()}
        assert alloc == {k: run for k, run in table.holders.by_gpu.items() if k[0] == node}
        assert {g for g, c in enumerate(gpumap.get(node, "")) if c == "#"} == {g for n, g in alloc if n == node}
        on_node = {
            j for j, rec in jobs.items() if rec.status in ACTIVE and any(p.node_id == node for p in rec.placement)
        }
        assert set(await r.smembers(store.key("noderuns", node))) == on_node
    assert await r.lrange(store.key("violations"), 0, -1) == table.holders.violations


async def project_and_compare(url: str, stream: list[tuple[int, Any, bool]], table: JobTable) -> None:
    store = Store.from_url(url, f"t{uuid.uuid4().hex[:10]}:")
    # The projector's own path for each message: decode, job_event_args, the Lua fold.
    projector = Projector(bus=None, store=store, stream="JOBS")  # type: ignore[arg-type]  # apply needs no bus
    try:
        for seq, event, applied in stream:
            assert await projector.apply([(seq, encode(event))]) == int(applied), (seq, event)
        await check_equal(store, table)
    finally:
        await store.flush()
        await store.close()


@settings(max_examples=150, deadline=None)
@given(data=st.data(), length=st.integers(1, 40))
def test_the_lua_fold_equals_the_python_fold(redis_server: Server, data: st.DataObject, length: int) -> None:
    table = JobTable()
    stream = draw_stream(data, table, length)
    asyncio.run(project_and_compare(redis_server.url, stream, table))
