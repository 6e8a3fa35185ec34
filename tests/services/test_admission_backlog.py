"""Admission keeps its pending and active jobs between cycles and re-reads only
the jobs with events: what it keeps must be what a fresh read of Redis gives,
after jobs change between cycles and after Redis is wiped and rebuilt."""

from __future__ import annotations

from test_admission_cycle import Clock, admission, cancel, spec
from test_placement_cycle import NOW, Harness, harness

from trainyard.bus import Bus
from trainyard.events import RunFailed
from trainyard.store import Store, views
from trainyard.testing.publish import publish_event
from trainyard_admission.cycle import AdmissionCycle


async def seen(cycle: AdmissionCycle) -> tuple[dict[str, tuple[int, float, float | None]], set[str]]:
    """What a cycle hands the core: each pending job's (order, attained GPU-seconds, backoff), the running jobs."""
    snapshot, _ = await cycle.snapshot()
    pending = {p.job_id: (p.order, p.attained_gpu_s, p.not_before) for p in snapshot.pending}
    return pending, {r.job_id for r in snapshot.running}


async def started(h: Harness) -> AdmissionCycle:
    await h.node("n1")
    await h.running("first", spec(), {"n1": list(range(8))}, NOW - 100)
    for job_id in ("a", "b"):
        await h.submit(job_id, spec(), admit=False)
    await h.settle()
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
