"""Admission keeps its pending and active jobs between cycles and re-reads only
the jobs with events: what it keeps must be what a fresh read of Redis gives,
after jobs change between cycles and after Redis is wiped and rebuilt."""

from __future__ import annotations

import asyncio
import time

from nats.js.errors import KeyNotFoundError
from test_admission_cycle import Clock, admission, cancel, spec
from test_placement_cycle import NOW, Harness, harness

from trainyard.bus import Bus
from trainyard.bus.lease import Lease
from trainyard.cycles import decision_loop
from trainyard.events import RunFailed
from trainyard.runtime import Runtime
from trainyard.settings import Settings
from trainyard.store import Store, views
from trainyard.testing.publish import publish_event
from trainyard.testing.waiting import eventually
from trainyard_admission.cycle import AdmissionCycle


async def seen(cycle: AdmissionCycle) -> tuple[dict[str, tuple[int, float, float | None]], set[str]]:
    """What a cycle hands the core: each pending job's (order, attained GPU-seconds, backoff), the running jobs."""
    snapshot, _ = await cycle.snapshot()
    pending = {p.job_id: (p.order, p.attained_gpu_s, p.not_before) for p in snapshot.pending}
    return pending, {r.job_id for r in snapshot.running}


async def taken(lease: Lease) -> bool:
    """Whether anyone holds ``lease``'s key now."""
    try:
        await lease.kv.get(lease.key)
    except KeyNotFoundError:
        return False
    return True


async def seeded(h: Harness) -> None:
    """One node held by a running job, and two jobs waiting for it."""
    await h.node("n1")
    await h.running("first", spec(), {"n1": list(range(8))}, NOW - 100)
    for job_id in ("a", "b"):
        await h.submit(job_id, spec(), admit=False)
    await h.settle()


async def started(h: Harness) -> AdmissionCycle:
    await seeded(h)
    cycle = admission(h, Clock(NOW))
    await cycle.run_once()
    return cycle


async def test_a_job_that_changes_between_cycles_is_seen(bus: Bus, store: Store) -> None:
    async with harness(bus, store) as h:
        cycle = await started(h)
        # Between cycles: one job is cancelled, one is new, and the running one is preempted back to pending.
        await cancel(h, "a")
        await h.submit("c", spec(), admit=False)
        failed = RunFailed(at=NOW, job_id="first", tenant="acme", run_id="first-r1", reason="preempted")
        await publish_event(bus, failed, msg_id="first-r1:failed")
        await h.settle()
        kept = await seen(cycle)
        fresh = await seen(admission(h, Clock(NOW)))
    assert set(kept[0]) == {"first", "b", "c"} and kept[1] == set()
    assert kept[0]["first"][1] == 800.0  # its run's GPU-seconds, read again
    assert kept == fresh


async def test_after_a_redis_wipe_and_rebuild_the_pending_set_and_reasons_are_right(bus: Bus, store: Store) -> None:
    async with harness(bus, store) as h:
        cycle = await started(h)
        assert sorted(await store.redis.hkeys(store.key("why", "pending"))) == ["a", "b"]
        await store.redis.flushall()
        await h.submit("c", spec(), admit=False)  # an event while the projection is rebuilt
        await h.settle()
        await cycle.run_once()
        kept = await seen(cycle)
        fresh = await seen(admission(h, Clock(NOW)))
        reasons = sorted(await store.redis.hkeys(store.key("why", "pending")))
        first = await views.get_job(store, "first")
    assert set(kept[0]) == {"a", "b", "c"} and kept[1] == {"first"}
    assert kept == fresh
    assert reasons == ["a", "b", "c"]  # written again after the wipe
    assert first is not None and first.status == "running"


async def test_a_standby_reads_the_backlog_and_its_first_cycle_rereads_only_what_changed(
    bus: Bus, store: Store
) -> None:
    async with harness(bus, store) as h:
        await seeded(h)
        standby = admission(h, Clock(NOW))
        await standby.warm()
        read_while_standing_by = set(standby.backlog.records)
        # The old leader said why "b" waits; then jobs change before the standby takes over.
        await h.store.redis.hset(h.store.key("why", "pending"), "b", '{"reason":"stale"}')
        await cancel(h, "a")
        await h.submit("c", spec(), admit=False)
        await h.settle()
        await standby.run_once()
        reread = standby.backlog.touched
        kept = await seen(standby)
        fresh = await seen(admission(h, Clock(NOW)))
        reasons = await store.redis.hgetall(store.key("why", "pending"))
    assert read_while_standing_by == {"first", "a", "b"}
    assert {"a", "c"} <= reread and "b" not in reread and "first" not in reread
    assert kept == fresh and set(kept[0]) == {"b", "c"}
    assert sorted(reasons) == ["b", "c"] and "stale" not in reasons["b"]  # every reason written on taking over


async def test_the_decision_loop_keeps_a_standby_warm_and_decides_nothing_while_another_leads(
    bus: Bus, store: Store
) -> None:
    stop = asyncio.Event()
    leader = await Lease.open(bus, "admission.test", holder="leader", ttl_s=5.0)
    standby_lease = await Lease.open(bus, "admission.test", holder="standby", ttl_s=5.0)
    assert await leader.try_acquire()
    async with harness(bus, store) as h:
        for job_id in ("a", "b"):
            await h.submit(job_id, spec(), admit=False)
        await h.settle()
        cycle = admission(h, Clock(NOW))
        decided: list[int] = []

        async def run_once() -> int:
            decided.append(await cycle.run_once())
            return 0

        rt = Runtime("standby", Settings(cycle_interval_s=0.05, cycle_coalesce_s=0.01), bus, store, stop)
        tasks = [
            asyncio.create_task(standby_lease.keep(stop)),
            asyncio.create_task(
                decision_loop(rt, run_once, standby_lease, [h.jobs, h.nodes], "admission", standby=cycle.warm)
            ),
        ]
        try:
            deadline = time.monotonic() + 10
            while set(cycle.backlog.records) != {"a", "b"} and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            warmed = set(cycle.backlog.records)
            await h.submit("c", spec(), admit=False)  # seen while standing by too
            while "c" not in cycle.backlog.records and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            warmed_again = set(cycle.backlog.records)
            reasons = await store.redis.hkeys(store.key("why", "pending"))
        finally:
            stop.set()
            await asyncio.gather(*tasks)
            await leader.release()
    assert warmed == {"a", "b"} and warmed_again == {"a", "b", "c"}
    assert decided == [] and reasons == []  # a standby neither decides nor says why jobs wait


async def test_a_process_that_has_just_started_reads_the_backlog_before_it_contends_for_the_lease(
    bus: Bus, store: Store
) -> None:
    """Nobody leads: the new process still reads every job first, so its first cycle as leader re-reads none."""
    stop = asyncio.Event()
    lease = await Lease.open(bus, "admission.fresh", holder="fresh", ttl_s=2.0)
    async with harness(bus, store) as h:
        await seeded(h)
        cycle = admission(h, Clock(NOW))
        key_during_read: list[bool] = []
        touched_in_cycles: list[set[str]] = []

        async def standby() -> None:
            key_during_read.append(await taken(lease))
            await cycle.warm()

        async def run_once() -> int:
            await cycle.run_once()
            touched_in_cycles.append(set(cycle.backlog.touched))
            return 0

        ready = asyncio.Event()
        rt = Runtime("fresh", Settings(cycle_interval_s=0.05, cycle_coalesce_s=0.01), bus, store, stop)
        tasks = [
            asyncio.create_task(lease.keep(stop, after=ready)),
            asyncio.create_task(
                decision_loop(rt, run_once, lease, [h.jobs, h.nodes], "admission", standby=standby, ready=ready)
            ),
        ]

        async def led() -> bool:
            return bool(touched_in_cycles)

        try:
            await eventually(led, timeout=10, what="a first cycle as leader")
        finally:
            stop.set()
            await asyncio.gather(*tasks)
            await lease.release()
        reasons = sorted(await store.redis.hkeys(store.key("why", "pending")))
    assert key_during_read and not any(key_during_read)  # nobody held the lease while the backlog was read
    assert touched_in_cycles and touched_in_cycles[0] == set()  # the first cycle as leader re-read no job
    assert reasons == ["a", "b"]  # and said why each waiting job waits


async def test_a_lease_that_waits_to_be_ready_stops_when_asked_without_taking_the_key(bus: Bus) -> None:
    stop, ready = asyncio.Event(), asyncio.Event()
    lease = await Lease.open(bus, "admission.never-ready", holder="waiting", ttl_s=2.0)
    keeper = asyncio.create_task(lease.keep(stop, after=ready))
    await asyncio.sleep(0)  # the keeper is waiting for ``ready``
    stop.set()
    await asyncio.wait_for(keeper, 5)  # returns although ``ready`` never came
    assert not lease.held and not await taken(lease)
