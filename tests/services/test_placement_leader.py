"""Two placement processes against one NATS and one Redis.

Finding: the Nats-Expected-Last-Subject-Sequence fence on ``JobPlaced`` is per
job, so it stops one job being placed twice, but not one GPU being given to two
jobs: two deciders whose snapshots differ (one saw a job admitted that the
other did not) each place a different job on the same free GPUs, and both
publishes pass their fences.  The first test shows this happening; it is why
placement has a single leader.  The second shows that with the lease only one
process decides at a time, including across a hand-over, and nothing is
double-allocated.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable

import pytest
from test_placement_cycle import CLUSTER, Harness, harness, job, rack

from trainyard.bus import Bus
from trainyard.bus.lease import Lease
from trainyard.core.invariants import check_job_log
from trainyard.core.placement import place
from trainyard.cycles import decision_loop
from trainyard.events import JobPlaced
from trainyard.local.servers import Server
from trainyard.runtime import Runtime
from trainyard.settings import Settings
from trainyard.store import Projector, Store, views
from trainyard.testing.streams import read_job_events
from trainyard_placement.handlers import PlacementCycle
from trainyard_placement.main import lease_key


@pytest.mark.parametrize(
    ("admit_between", "double_allocated", "fenced"),
    [
        pytest.param(
            False,
            False,
            1,
            id="two deciders with the same snapshot make the same choice and the fence refuses the second",
        ),
        pytest.param(
            True,
            True,
            0,
            id="two deciders with different snapshots give one GPU to two jobs: the fence alone is not enough",
        ),
    ],
)
async def test_two_deciders_without_a_lease(
    bus: Bus, store: Store, admit_between: bool, double_allocated: bool, fenced: int
) -> None:
    async with harness(bus, store) as h:
        await h.node("n1")
        await h.submit("early", job(8), admit=False)  # accepted first: placed first once admitted
        await h.submit("late", job(8))
        await h.settle()
        a, b = h.cycle(), h.cycle()
        snap_a = await a.snapshot()
        if admit_between:
            await h.admit("early")
            await h.settle()
        snap_b = await b.snapshot()
        await a.publish(snap_a, place(snap_a.cluster, snap_a.requests, 0.0))
        await b.publish(snap_b, place(snap_b.cluster, snap_b.requests, 0.0))
        await h.settle()

        log_violations = check_job_log(await read_job_events(bus)).violations
        store_violations = await views.violations(store)
        assert bool(log_violations) == double_allocated
        assert bool(store_violations) == double_allocated
        assert a.stats.conflicts + b.stats.conflicts == fenced


class Process:
    """One placement 'process': its own connection, projectors, lease and decision loop."""

    def __init__(self, name: str, bus: Bus, store: Store, ttl_s: float) -> None:
        self.name = name
        self.bus = bus
        self.stop = asyncio.Event()
        self.jobs = Projector(bus, store, "JOBS")
        self.nodes = Projector(bus, store, "NODES")
        self.ttl_s = ttl_s
        self.lease: Lease | None = None
        self.cycle: PlacementCycle | None = None
        self.rt = Runtime(name, Settings(cycle_interval_s=0.1, cycle_coalesce_s=0.01), bus, store, self.stop)
        self.tasks: dict[str, asyncio.Task[None]] = {}

    async def start(self) -> None:
        self.lease = await Lease.open(self.bus, lease_key(CLUSTER), holder=self.name, ttl_s=self.ttl_s)
        self.cycle = PlacementCycle(
            self.bus, self.rt.store, self.jobs, CLUSTER, time.time, node_projector=(self.nodes,), lease=self.lease
        )
        self.tasks = {
            "jobs": asyncio.create_task(self.jobs.run(self.stop)),
            "nodes": asyncio.create_task(self.nodes.run(self.stop)),
            "lease": asyncio.create_task(self.lease.keep(self.stop)),
            "decide": asyncio.create_task(
                decision_loop(self.rt, self.cycle.run_once, self.lease, [self.jobs, self.nodes], "placement")
            ),
        }

    async def close(self) -> None:
        self.stop.set()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        await self.bus.close()


async def stall(p: Process) -> None:
    """The leader stops renewing (a long pause, a partition) but keeps running."""
    p.tasks["lease"].cancel()


async def stop_cleanly(p: Process) -> None:
    """The leader shuts down and gives its lease back."""
    assert p.lease is not None
    p.tasks["lease"].cancel()
    p.tasks["decide"].cancel()
    await p.lease.release()


async def complete_placed_runs(h: Harness, stop: asyncio.Event) -> None:
    """Stand in for the nodes: every placed run starts and succeeds at once."""
    done: set[str] = set()
    while not stop.is_set():
        active = await views.ids_in(h.store, "active")
        for view in await views.get_jobs(h.store, active):
            if view.status == "placed" and view.run_id and view.run_id not in done:
                done.add(view.run_id)
                await h.finish(view.job_id, view.run_id)
        await asyncio.sleep(0.02)


async def wait_for(predicate: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await predicate() if asyncio.iscoroutinefunction(predicate) else predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize(
    "hand_over",
    [
        pytest.param(stall, id="a leader that stops renewing stops deciding and the standby takes over after expiry"),
        pytest.param(stop_cleanly, id="a leader that stops cleanly releases the lease and the standby takes over"),
    ],
)
async def test_with_a_lease_one_process_decides_at_a_time(
    nats_server: Server, bus: Bus, store: Store, hand_over: Callable[[Process], object]
) -> None:
    rng = random.Random(5)
    shapes = [(1, 1), (1, 2), (1, 4), (1, 8), (2, 8), (2, 4)]
    jobs = [(f"j{i:03d}", job(*reversed(rng.choice(shapes)))) for i in range(60)]
    procs = [Process(name, await Bus.connect(nats_server.url, name), store, ttl_s=1.0) for name in ("p1", "p2")]
    runner_stop = asyncio.Event()
    async with harness(bus, store) as h:
        for node_id, rack_name, _ in rack("r1", 2) + rack("r2", 2):
            await h.node(node_id, rack_name)
        await h.settle()
        for p in procs:
            await p.start()
        runner = asyncio.create_task(complete_placed_runs(h, runner_stop))
        try:
            for job_id, spec in jobs[:30]:
                await h.submit(job_id, spec)
            leader = await _leader(procs)
            standby = next(p for p in procs if p is not leader)
            assert leader.cycle and standby.cycle and leader.lease and standby.lease
            await wait_for(lambda: leader.cycle.stats.placed >= 10, 20, "the leader to place some jobs")
            await hand_over(leader)
            await wait_for(lambda: standby.lease.held, 10, "the standby to take the lease")
            assert not leader.lease.held
            placed_by_old = list(leader.cycle.stats.placed_jobs)
            for job_id, spec in jobs[30:]:  # work that only the new leader can place
                await h.submit(job_id, spec)

            async def all_succeeded() -> bool:
                return (await views.status_counts(store)).get("succeeded", 0) == len(jobs)

            await wait_for(all_succeeded, 60, "every job to succeed")
            assert standby.lease.held
        finally:
            runner_stop.set()
            await runner
            for p in procs:
                await p.close()

        events = await read_job_events(bus)
        fold = check_job_log(events)
        assert fold.violations == []
        assert await views.violations(store) == []
        placements = [e for e in events if isinstance(e, JobPlaced)]
        assert sorted(e.job_id for e in placements) == sorted(j for j, _ in jobs)  # each job placed exactly once
        # The old leader decided nothing after the hand-over; the standby decided everything
        # submitted after it.  (A publish the old leader had in flight when it stopped may have
        # landed without its answer arriving: such a job is on the log once, in neither count.)
        assert leader.cycle.stats.placed_jobs == placed_by_old
        assert not set(standby.cycle.stats.placed_jobs) & set(placed_by_old)
        assert set(standby.cycle.stats.placed_jobs) >= {j for j, _ in jobs[30:]}
        assert standby.cycle.stats.placed > 0
        # Leadership changed once: every job the old leader placed precedes, on the log, every one the standby placed.
        order = [e.job_id for e in placements]
        last_old = max(order.index(j) for j in placed_by_old)
        assert all(order.index(j) > last_old for j in standby.cycle.stats.placed_jobs)


async def _leader(procs: list[Process]) -> Process:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        held = [p for p in procs if p.lease and p.lease.held]
        if len(held) == 1:
            return held[0]
        assert len(held) < 2, "two processes hold the lease"
        await asyncio.sleep(0.05)
    raise AssertionError("no process took the lease")
