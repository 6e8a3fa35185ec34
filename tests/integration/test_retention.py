"""Retention of the JOBS projection: a finished job leaves Redis once its
retention has passed, with every index entry it had, after its record is in
the job archive; the ledger's usage (finance's exports) is not touched.

Real NATS and Redis; the archive on SQLite, and on PostgreSQL when
TRAINYARD_TEST_POSTGRES_URL is set (as the other ledger tests)."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainyard.bus import Bus
from trainyard.core.accounting import load_rate_card
from trainyard.domain import JobSpec, Role
from trainyard.events import (
    JobAccepted,
    JobAdmitted,
    JobCancelled,
    JobPlaced,
    JobRejected,
    ReplicaPlacement,
    RunStarted,
    RunSucceeded,
    decode_job_event,
)
from trainyard.ledger import chargeback_rows
from trainyard.ledger.archive import JobArchive
from trainyard.ledger.snapshots import SnapshotStore
from trainyard.store import Projector, Store, views
from trainyard.store.projection_check import jobs_missing
from trainyard.store.projections import RedisProjections
from trainyard.store.retention import backfill, run_sweeper, sweep
from trainyard.store.snapshot import EXACT, FAMILIES, restore, take
from trainyard.testing.publish import publish_event
from trainyard.testing.streams import project, read_raw
from trainyard.testing.waiting import eventually
from trainyard_accounting.writer import LedgerWriter
from trainyard_gateway.jobs import Conflict, JobIdTaken, JobOperations, NotFound

POSTGRES_ENV = "TRAINYARD_TEST_POSTGRES_URL"
T0 = 1_793_491_200.0  # 2026-11-01T00:00:00Z
DAY = 86_400.0
DEC15 = T0 + 44 * DAY
CARD = load_rate_card(
    {"currency": "USD", "versions": [{"version": "v1", "effective_from": "2026-10-01", "prices": {"*": "2.00"}}]}
)
FINISHED = ("done", "gone", "bad")  # succeeded, cancelled, rejected in November


def spec(tenant: str = "acme") -> JobSpec:
    role = Role(name="trainer", replicas=1, gpus_per_replica=2)
    return JobSpec(tenant=tenant, queue="default", roles=[role], simulated_duration_s=60)


def _run(job_id: str, tenant: str, at: float, node: str) -> list[object]:
    run = f"{job_id}-r1"
    placed = [ReplicaPlacement(role="trainer", replica=0, rank=0, node_id=node, gpus=[0, 1])]
    return [
        JobAccepted(at=at, job_id=job_id, spec=spec(tenant), submitted_at=at),
        JobAdmitted(at=at + 1, job_id=job_id, tenant=tenant, run_id=run, attempt=1),
        JobPlaced(at=at + 2, job_id=job_id, tenant=tenant, run_id=run, cluster="c1", replicas=placed),
        RunStarted(at=at + 3, job_id=job_id, tenant=tenant, run_id=run),
    ]


def _events() -> list[object]:
    """Three jobs finished in November, one finished in December, one running."""
    done = _run("done", "acme", T0 + DAY, "n1") + [
        RunSucceeded(at=T0 + DAY + 3600, job_id="done", tenant="acme", run_id="done-r1")
    ]
    gone = [
        JobAccepted(at=T0 + 2 * DAY, job_id="gone", spec=spec("beta"), submitted_at=T0 + 2 * DAY),
        JobCancelled(at=T0 + 2 * DAY + 5, job_id="gone", tenant="beta", reason="by user"),
    ]
    bad = [JobRejected(at=T0 + 3 * DAY, job_id="bad", tenant="acme", errors=[])]
    late = _run("late", "acme", T0 + 40 * DAY, "n2") + [
        RunSucceeded(at=T0 + 40 * DAY + 60, job_id="late", tenant="acme", run_id="late-r1")
    ]
    return done + gone + bad + late + _run("live", "beta", T0 + 5 * DAY, "n3")


async def _publish_and_project(bus: Bus, store: Store) -> None:
    """Publish :func:`_events` and fold them into Redis."""
    for i, event in enumerate(_events()):
        await publish_event(bus, event, msg_id=f"e{i}")
    await project(bus, store, "JOBS")


async def _dump(store: Store) -> dict[str, object]:
    """Every key of the installation and its value."""
    out: dict[str, object] = {}
    async for key in store.redis.scan_iter(match=store.prefix + "*"):
        kind = await store.redis.type(key)
        if kind == "hash":
            out[key] = await store.redis.hgetall(key)
        elif kind == "zset":
            out[key] = await store.redis.zrange(key, 0, -1, withscores=True)
        elif kind == "set":
            out[key] = sorted(await store.redis.smembers(key))
        elif kind == "list":
            out[key] = await store.redis.lrange(key, 0, -1)
        else:
            out[key] = await store.redis.get(key)
    return out


def _mentions(dump: dict[str, object], job_id: str) -> list[str]:
    """The keys that name ``job_id``: in their name, as a hash field, or as a member."""

    def names(key: str, value: object) -> bool:
        if key.endswith(":" + job_id) or (isinstance(value, dict) and job_id in value):
            return True
        return isinstance(value, list) and any(job_id == (m[0] if isinstance(m, tuple) else m) for m in value)

    return [key for key, value in dump.items() if names(key, value)]


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A ledger database and a table prefix of its own."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/ledger.db", ""
        return
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        pytest.skip(f"set {POSTGRES_ENV} to run against PostgreSQL")
    prefix = f"t{uuid.uuid4().hex[:12]}_"
    yield url, prefix
    for cleanup in (JobArchive(url, prefix=prefix), LedgerWriter(url, prefix=prefix)):
        cleanup.drop_schema()
        cleanup.close()


@pytest.fixture
def archive(ledger_url: tuple[str, str]) -> Iterator[JobArchive]:
    url, prefix = ledger_url
    archive = JobArchive(url, prefix=prefix)
    archive.create_schema()
    yield archive
    archive.close()


async def test_a_finished_job_leaves_the_projection_with_every_key_it_touched_after_it_is_archived(
    bus: Bus, store: Store, archive: JobArchive
) -> None:
    await _publish_and_project(bus, store)
    before = {j.job_id: j for j in await views.get_jobs(store, [*FINISHED, "late", "live"])}
    assert {j.status for j in before.values()} == {"succeeded", "cancelled", "rejected", "running"}
    dump = await _dump(store)
    assert all(_mentions(dump, job_id) for job_id in FINISHED)

    assert await sweep(store, archive, cutoff=DEC15 - 7 * DAY, batch=2) == 3  # two batches

    after = await _dump(store)
    assert {job_id: _mentions(after, job_id) for job_id in FINISHED} == {j: [] for j in FINISHED}
    assert [archive.get(job_id) for job_id in FINISHED] == [before[j] for j in FINISHED]
    kept = await views.get_jobs(store, ["late", "live"])
    assert kept == [before["late"], before["live"]]
    assert await views.status_counts(store) == {"succeeded": 1, "running": 1}
    assert [j.job_id for j in await views.list_jobs(store)] == ["live", "late"]
    assert await views.list_jobs(store, status="cancelled") == []
    assert await views.list_jobs(store, tenant="beta") == [before["live"]]
    # a projector joining this projection finds it whole, though its newest events made jobs it forgot
    assert await jobs_missing(bus, store, await store.last_seq("jobs")) is None

    assert await sweep(store, archive, cutoff=DEC15 - 7 * DAY) == 0  # again: nothing more
    assert await _dump(store) == after
    assert [j.job_id for j in archive.list()] == ["bad", "gone", "done"]  # newest first
    assert [j.job_id for j in archive.list(tenant="acme", status="rejected")] == ["bad"]
    assert [j.job_id for j in archive.list(newest_first=False, after=(float(before["done"].order), "done"))] == [
        "gone",
        "bad",
    ]


class _StoppedAfterCommit(JobArchive):
    """An archive whose process stops right after a batch is stored."""

    def put(self, records, places=None):  # type: ignore[no-untyped-def]
        super().put(records, places)
        raise OSError("stopped after storing")


class _StoppedBeforeCommit(JobArchive):
    def put(self, records, places=None):  # type: ignore[no-untyped-def]
        raise OSError("database went away")


async def test_a_sweep_stopped_before_or_after_archiving_loses_no_job(
    bus: Bus, store: Store, archive: JobArchive, ledger_url: tuple[str, str]
) -> None:
    await _publish_and_project(bus, store)
    before = await _dump(store)
    url, prefix = ledger_url

    with pytest.raises(OSError):
        await sweep(store, _StoppedBeforeCommit(url, prefix=prefix), cutoff=DEC15)
    assert await _dump(store) == before and archive.count() == 0

    with pytest.raises(OSError):
        await sweep(store, _StoppedAfterCommit(url, prefix=prefix), cutoff=DEC15, batch=2)
    assert await _dump(store) == before  # stored, not yet forgotten
    assert archive.count() == 2

    assert await sweep(store, archive, cutoff=DEC15) == 4
    assert sorted(j.job_id for j in archive.list()) == ["bad", "done", "gone", "late"]
    assert [j.job_id for j in await views.list_jobs(store)] == ["live"]


async def test_the_sweeper_forgets_a_job_only_once_its_retention_has_passed_on_its_clock(
    bus: Bus, store: Store, archive: JobArchive
) -> None:
    await _publish_and_project(bus, store)
    now = [T0 + 40 * DAY]  # "late" finished seconds ago, the others weeks ago
    stop = asyncio.Event()
    task = asyncio.create_task(run_sweeper(stop, store, archive, 7 * DAY, 0.05, clock=lambda: now[0]))
    try:
        await eventually(lambda: _ids_are(store, ["live", "late"]), what="November's jobs forgotten")
        assert archive.get("late") is None
        now[0] = T0 + 47 * DAY + 61  # a week after "late" finished
        await eventually(lambda: _ids_are(store, ["live"]), what="the December job forgotten")
    finally:
        stop.set()
        await task
    assert archive.get("late") is not None and archive.get("live") is None


async def _ids(store: Store) -> list[str]:
    return [j.job_id for j in await views.list_jobs(store)]


async def _ids_are(store: Store, expected: list[str]) -> bool:
    return await _ids(store) == expected


async def test_a_projection_folded_before_the_finished_index_is_indexed_and_swept(
    bus: Bus, store: Store, archive: JobArchive
) -> None:
    await _publish_and_project(bus, store)
    await store.redis.delete(store.key("finished"))  # as an older fold left it

    assert await sweep(store, archive, cutoff=DEC15) == 0
    assert await backfill(store) == 4
    assert await backfill(store) == 0
    assert await sweep(store, archive, cutoff=DEC15) == 4
    assert await _ids(store) == ["live"]


async def test_a_past_months_chargeback_is_the_same_before_and_after_retention(
    bus: Bus, store: Store, archive: JobArchive, ledger_url: tuple[str, str]
) -> None:
    await _publish_and_project(bus, store)
    url, prefix = ledger_url
    ledger = LedgerWriter(url, prefix=prefix)
    ledger.create_schema()
    try:
        ledger.apply([(str(seq), decode_job_event(data)) for seq, _, data in await read_raw(bus, "JOBS")])
        november = chargeback_rows(ledger, "2026-11", CARD, now=DEC15)
        assert november and {r["ResourceId"] for r in november} >= {"done-r1"}

        assert await sweep(store, archive, cutoff=DEC15) == 4

        assert chargeback_rows(ledger, "2026-11", CARD, now=DEC15) == november
        assert await _ids(store) == ["live"]
    finally:
        ledger.close()


async def test_a_forgotten_job_is_still_read_cancelled_and_owned_through_the_archive(
    bus: Bus, store: Store, archive: JobArchive
) -> None:
    await _publish_and_project(bus, store)
    held = await views.get_job(store, "done")
    assert await sweep(store, archive, cutoff=DEC15) == 4
    ops = JobOperations(bus, store, archive=archive)

    view = await ops.get("done", tenant="acme")
    assert (view.status, view.finished_at, view.run_id) == ("succeeded", held.finished_at, "done-r1")
    with pytest.raises(NotFound):
        await ops.get("done", tenant="beta")  # another tenant's job stays unseen
    with pytest.raises(NotFound):
        await JobOperations(bus, store).get("done")  # without the archive the job is gone
    with pytest.raises(Conflict, match="already succeeded"):
        await ops.cancel("done", actor="alice")
    with pytest.raises(JobIdTaken):
        await ops.submit(spec("beta"), "done", actor="bob")  # its id stays its tenant's
    assert await RedisProjections(bus, store, archive).job("gone") == archive.get("gone")  # admission's read


@pytest.fixture
def snapshots(ledger_url: tuple[str, str]) -> Iterator[SnapshotStore]:
    url, prefix = ledger_url
    store = SnapshotStore(url, prefix=prefix)
    yield store
    store.drop_schema()
    store.close()


async def _rebuild(bus: Bus, store: Store, snapshots: SnapshotStore | None) -> None:
    projector = Projector(bus, store, "JOBS", snapshots)
    stop = asyncio.Event()
    task = asyncio.create_task(projector.run(stop))
    try:
        await projector.wait_for((await bus.js.stream_info("JOBS")).state.last_seq)
    finally:
        stop.set()
        await task


async def _projection(store: Store) -> dict[str, object]:
    """Every key of the JOBS projection, its epoch left out."""
    dump = {k.removeprefix(store.prefix): v for k, v in (await _dump(store)).items()}
    jobs = {k: v for k, v in dump.items() if k in EXACT or k.split(":")[0] in FAMILIES}
    marker = jobs.pop("proj:jobs")
    assert isinstance(marker, dict)
    return jobs | {"proj:jobs": {k: v for k, v in marker.items() if k != "epoch"}}


async def test_a_rebuild_after_the_stream_and_projection_were_trimmed_reproduces_the_projection_exactly(
    bus: Bus, store: Store, archive: JobArchive, snapshots: SnapshotStore, caplog: pytest.LogCaptureFixture
) -> None:
    await _publish_and_project(bus, store)
    assert await sweep(store, archive, cutoff=DEC15 - 7 * DAY) == 3
    snapshot = await take(store)
    assert snapshot is not None and snapshots.put("jobs", snapshot)
    later = [
        RunSucceeded(at=T0 + 45 * DAY, job_id="live", tenant="beta", run_id="live-r1"),
        *_run("next", "acme", T0 + 45 * DAY, "n1"),
    ]
    for i, event in enumerate(later):
        await publish_event(bus, event, msg_id=f"later{i}")
    await project(bus, store, "JOBS")
    before = await _projection(store)
    assert {"job:late", "job:live", "job:next"} <= set(before) and "job:done" not in before

    await bus.js.purge_stream("JOBS", seq=snapshot.seq + 1)  # the stream keeps only what came after
    assert (await bus.js.stream_info("JOBS")).state.first_seq == snapshot.seq + 1
    await store.redis.flushall()
    await _rebuild(bus, store, snapshots)
    assert await _projection(store) == before
    assert "no snapshot covers them" not in caplog.text

    await store.redis.flushall()
    await _rebuild(bus, store, None)  # without the snapshot, the trimmed events are missing
    assert set(await _projection(store)) < set(before)
    assert f"JOBS projection holds through 0 but the stream starts at {snapshot.seq + 1}" in caplog.text

    await store.redis.flushall()  # a snapshot past the stream's end is another stream's: not written back
    assert await restore(store, snapshots, stream_last=snapshot.seq - 1) is None
    assert await _dump(store) == {}
