"""A projection notices every loss and every gap before its next write, and
rebuilds itself whole; readers wait for it instead of giving up."""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import pytest
from nats.js.errors import NotFoundError
from test_projection import lifecycle, spec

from trainyard.bus import Bus
from trainyard.emulator import EmulatedCluster
from trainyard.emulator.cluster import default_topology
from trainyard.events import (
    JobAccepted,
    JobAdmitted,
    JobPlaced,
    ReplicaPlacement,
    RunStarted,
    RunSucceeded,
    decode_job_event,
    subjects,
)
from trainyard.local.servers import Server, start_redis
from trainyard.local.supervisor import restart_server
from trainyard.store import Projector, Store, views
from trainyard.store.projector import ProjectionLost, wait_until_projected
from trainyard.testing.publish import publish_event
from trainyard.testing.waiting import eventually


async def snapshot(store: Store) -> dict[str, Any]:
    """Every key of the installation with its value (the epoch left out)."""
    r, out = store.redis, {}
    async for key in r.scan_iter(match=store.prefix + "*", count=1000):
        kind, name = await r.type(key), key[len(store.prefix) :]
        if kind == "hash":
            out[name] = {k: v for k, v in (await r.hgetall(key)).items() if k != "epoch"}
        elif kind == "zset":
            out[name] = await r.zrange(key, 0, -1, withscores=True)
        elif kind == "set":
            out[name] = sorted(await r.smembers(key))
        elif kind == "list":
            out[name] = await r.lrange(key, 0, -1)
        else:
            out[name] = await r.get(key)
    return out


async def fresh_replay(bus: Bus, redis_server: Server) -> dict[str, Any]:
    """What a projector replaying the whole JOBS stream into an empty Redis builds."""
    store = Store.from_url(redis_server.url, f"t{uuid.uuid4().hex[:10]}:")
    try:
        projector = Projector(bus, store, "JOBS")
        stop = asyncio.Event()
        task = asyncio.create_task(projector.run(stop))
        await projector.caught_up(timeout=60)
        stop.set()
        await task
        return await snapshot(store)
    finally:
        await store.flush()
        await store.close()


class Wiping(Projector):
    """Wipes Redis (FLUSHALL) right before its next apply: after the loss check."""

    wipe_next = False

    async def apply(self, batch: list[tuple[int, bytes]], after: int | None = None) -> int:
        if self.wipe_next:
            self.wipe_next = False
            await self.store.redis.flushall()
        return await super().apply(batch, after)


class Held(Projector):
    """Applies nothing while ``open`` is clear."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.open = asyncio.Event()
        self.open.set()

    async def apply(self, batch: list[tuple[int, bytes]], after: int | None = None) -> int:
        await self.open.wait()
        return await super().apply(batch, after)


async def test_a_wipe_right_before_an_apply_is_noticed_and_the_projection_rebuilt_whole(
    bus: Bus, store: Store, redis_server: Server
) -> None:
    for i in range(5):
        await lifecycle(bus, f"j{i}", f"j{i}-r1", "n1", [i])
    projector = Wiping(bus, store, "JOBS")
    stop = asyncio.Event()
    task = asyncio.create_task(projector.run(stop))
    await projector.caught_up()
    first_epoch = projector.epoch

    projector.wipe_next = True
    await publish_event(bus, RunSucceeded(at=5.0, job_id="j0", tenant="acme", run_id="j0-r1"), msg_id="j0:done")
    await lifecycle(bus, "j9", "j9-r1", "n1", [0, 7])  # GPU 0 was freed by j0 just before
    await projector.caught_up(timeout=60)
    stop.set()
    await task

    assert projector.lost_count >= 1 and projector.epoch != first_epoch
    assert await snapshot(store) == await fresh_replay(bus, redis_server)
    assert await views.violations(store) == []
    statuses = {j.job_id: j.status for j in await views.get_jobs(store, [f"j{i}" for i in (0, 1, 2, 3, 4, 9)])}
    assert statuses == {
        "j0": "succeeded",
        "j1": "running",
        "j2": "running",
        "j3": "running",
        "j4": "running",
        "j9": "running",
    }
    gpumap = await store.redis.hget(store.key("gpumap"), "n1") or ""
    assert {g for g, c in enumerate(gpumap) if c == "#"} == {0, 1, 2, 3, 4, 7}


async def test_a_batch_that_does_not_continue_the_projection_is_refused_and_rebuilt(
    bus: Bus, store: Store, redis_server: Server
) -> None:
    await lifecycle(bus, "j1", "j1-r1", "n1", [0, 1])  # seqs 1-4
    first = Projector(bus, store, "JOBS")
    stop = asyncio.Event()
    task = asyncio.create_task(first.run(stop))
    await first.caught_up()
    stop.set()
    await task
    await lifecycle(bus, "j2", "j2-r1", "n1", [2, 3])  # seqs 5-8
    before = await snapshot(store)

    late = Projector(bus, store, "JOBS")
    assert await late.join() == 4
    batch = [(seq, (await bus.js.get_msg("JOBS", seq)).data or b"") for seq in (7, 8)]
    with pytest.raises(ProjectionLost, match="gap"):
        await late.apply(batch, after=6)  # seqs 5 and 6 skipped
    assert await snapshot(store) == before  # refused: nothing changed

    stop = asyncio.Event()
    task = asyncio.create_task(late.run(stop))
    await late.caught_up()
    stop.set()
    await task
    assert await snapshot(store) == await fresh_replay(bus, redis_server)


async def test_an_apply_under_another_epoch_changes_nothing(bus: Bus, store: Store) -> None:
    await lifecycle(bus, "j1", "j1-r1", "n1", [0, 1])
    stale = Projector(bus, store, "JOBS")
    await stale.join()
    await store.redis.hset(store.key("proj", "jobs"), "epoch", "someone-else")  # rebuilt meanwhile
    data = (await bus.js.get_msg("JOBS", 1)).data or b""
    with pytest.raises(ProjectionLost, match="epoch"):
        await stale.apply([(1, data)], after=0)
    assert await views.get_job(store, "j1") is None
    assert await store.last_seq("jobs") == 0


async def delivered_placed(emulator: EmulatedCluster) -> list[int]:
    """Wrap the emulator's handler to record each delivery count of a JobPlaced."""
    counts: list[int] = []
    handle = emulator.handle

    async def counting(batch):  # type: ignore[no-untyped-def]
        counts.extend(d.delivered for d in batch if isinstance(d.event, JobPlaced))
        return await handle(batch)

    emulator.handle = counting  # type: ignore[method-assign]
    return counts


async def last_event(bus: Bus, job_id: str) -> object:
    return decode_job_event((await bus.js.get_last_msg("JOBS", subjects.job_history("acme", job_id))).data or b"")


async def test_a_placement_waits_out_a_lagging_projection_and_is_never_dead_lettered(bus: Bus, store: Store) -> None:
    nodes = default_topology(cluster="c1", nodes=1, gpus=8)
    projector = Held(bus, store, "JOBS")
    stop_projector = asyncio.Event()
    projecting = asyncio.create_task(projector.run(stop_projector))
    await publish_event(bus, JobAccepted(at=1.0, job_id="j1", spec=spec(2), submitted_at=0.5), msg_id="acc")
    await publish_event(bus, JobAdmitted(at=2.0, job_id="j1", tenant="acme", run_id="r1", attempt=1), msg_id="adm")

    # An emulator that has seen the job accepted, then restarts: its successor
    # learns the job's duration from the projection only.
    stop = asyncio.Event()
    first = EmulatedCluster(bus, store, nodes)
    running = asyncio.create_task(first.run(stop))
    await eventually(lambda: _acked_through(bus, 2))
    stop.set()
    await running
    await projector.caught_up()

    stop = asyncio.Event()
    second = EmulatedCluster(bus, store, nodes)
    counts = await delivered_placed(second)
    resumed = asyncio.Event()
    resume = second.resume

    async def resume_and_tell(timeout: float | None = None) -> None:
        await resume(timeout)
        resumed.set()

    second.resume = resume_and_tell  # type: ignore[method-assign]
    running = asyncio.create_task(second.run(stop))
    await asyncio.wait_for(resumed.wait(), 60)  # from here on it only consumes
    projector.open.clear()  # the projection lags from here on
    placed = [ReplicaPlacement(role="trainer", replica=0, rank=0, node_id=nodes[0].node_id, gpus=[0, 1])]
    await publish_event(
        bus, JobPlaced(at=3.0, job_id="j1", tenant="acme", run_id="r1", cluster="c1", replicas=placed), msg_id="pl"
    )

    async def delivered_more_than_max_deliver() -> bool:
        return bool(counts) and max(counts) > 11  # the old limit dead-lettered on the 10th

    await eventually(delivered_more_than_max_deliver, timeout=120)
    assert (await bus.js.stream_info("DEADLETTER")).state.messages == 0
    assert isinstance(await last_event(bus, "j1"), JobPlaced)  # not started while the projection lags

    projector.open.set()

    async def started() -> bool:
        return isinstance(await last_event(bus, "j1"), RunStarted)

    await eventually(started, timeout=60)
    assert "r1" in second.running
    assert (await bus.js.stream_info("DEADLETTER")).state.messages == 0
    stop.set()
    stop_projector.set()
    await asyncio.gather(running, projecting)


async def _acked_through(bus: Bus, seq: int) -> bool:
    try:
        info = await bus.js.consumer_info("JOBS", "emulator-c1")
    except NotFoundError:  # the emulator has not made it yet
        return False
    return info.ack_floor.stream_seq >= seq


async def test_a_node_agent_restarted_during_a_rebuild_waits_and_resumes_its_runs(bus: Bus, store: Store) -> None:
    nodes = default_topology(cluster="c1", nodes=1, gpus=8)
    for i in range(3):
        await lifecycle(bus, f"j{i}", f"j{i}-r1", nodes[0].node_id, [2 * i, 2 * i + 1])
    projector = Held(bus, store, "JOBS")
    stop = asyncio.Event()
    task = asyncio.create_task(projector.run(stop))
    await projector.caught_up()

    projector.open.clear()
    await store.redis.flushall()  # Redis lost; the rebuild is held back
    emulator = EmulatedCluster(bus, store, nodes)
    resuming = asyncio.create_task(emulator.resume())

    async def rebuild_started() -> bool:
        return projector.lost_count >= 1

    await eventually(rebuild_started)
    assert not resuming.done()  # waiting, not resuming from an empty projection

    projector.open.set()
    await asyncio.wait_for(resuming, 60)
    assert set(emulator.running) == {"j0-r1", "j1-r1", "j2-r1"}
    for handle in emulator.running.values():
        handle.cancel()
    stop.set()
    await task


class JoinsThenWaits(Projector):
    """Joins the projection, then lets another process rebuild it before following."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.rebuilt = asyncio.Event()

    async def join(self) -> int:
        last = await super().join()
        await self.rebuilt.wait()
        return last


async def test_a_projector_that_joins_a_projection_another_process_rebuilt_is_caught_up_on_a_quiet_stream(
    bus: Bus, store: Store
) -> None:
    """After a wipe, one process starts the new epoch and another rebuilds it
    to the head before the first follows: the first must count the rebuilt
    events as seen, though none of them is ever delivered to it."""
    for i in range(3):
        await lifecycle(bus, f"j{i}", f"j{i}-r1", "n1", [i])
    stop = asyncio.Event()
    first = JoinsThenWaits(bus, store, "JOBS")
    first_task = asyncio.create_task(first.run(stop))
    while not (await store.projection_state("jobs"))[0]:  # the first process started the epoch
        await asyncio.sleep(0.01)
    other = Projector(bus, store, "JOBS")
    other_task = asyncio.create_task(other.run(stop))
    await other.caught_up(timeout=30)
    first.rebuilt.set()
    await first.caught_up(timeout=30)  # no new event arrives on the stream
    assert first.epoch == other.epoch and first.position == other.position
    stop.set()
    await asyncio.gather(first_task, other_task)


async def test_a_reader_waits_out_redis_being_down_instead_of_failing(bus: Bus, tmp_path, caplog) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.INFO, logger="trainyard.store.projector")
    redis_server = start_redis(tmp_path / "redis")
    store = Store.from_url(redis_server.url, "down:")
    try:
        await lifecycle(bus, "j1", "r1", "n1", [0, 1])
        head = (await bus.js.stream_info("JOBS")).state.last_seq
        redis_server.kill()
        waiting = asyncio.create_task(wait_until_projected(bus, store, "JOBS"))

        async def polled_a_dead_redis() -> bool:
            return waiting.done() or "waiting for the JOBS projection" in caplog.text

        await eventually(polled_a_dead_redis)
        assert not waiting.done(), waiting.exception()

        await asyncio.to_thread(restart_server, redis_server)
        projector = Projector(bus, store, "JOBS")
        stop = asyncio.Event()
        running = asyncio.create_task(projector.run(stop))

        assert await asyncio.wait_for(waiting, 60) == head
        stop.set()
        await running
    finally:
        await store.close()
        redis_server.stop()
