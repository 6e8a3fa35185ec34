"""The placement cycle against events projected through real NATS and Redis:
topology-aware gangs, backfill around a reservation, and cordoned nodes.

The harness here is shared with test_placement_leader.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import msgspec
import pytest

from trainyard.bus import Bus
from trainyard.domain import JobSpec, NodeInfo, Role
from trainyard.events import (
    JobAccepted,
    JobAdmitted,
    JobPlaced,
    NodeRegistered,
    ReplicaPlacement,
    RunStarted,
    RunSucceeded,
    subjects,
)
from trainyard.events.nodes import NodeStateChanged
from trainyard.store import Projector, Store, job_hash, views, waiting
from trainyard.testing.publish import publish_event
from trainyard_placement.handlers import PlacementCycle

CLUSTER = "c1"
NOW = 1_700_000_000.0  # the cycle's clock


def job(gpus: int = 8, replicas: int = 1, max_runtime_s: int = 3600, tenant: str = "acme") -> JobSpec:
    return JobSpec(
        tenant=tenant,
        queue="default",
        max_runtime_s=max_runtime_s,
        roles=[Role(name="trainer", replicas=replicas, gpus_per_replica=gpus)],
    )


class Harness:
    """Publishes node and job events and keeps a JOBS and a NODES projector running."""

    def __init__(self, bus: Bus, store: Store) -> None:
        self.bus = bus
        self.store = store
        self.jobs = Projector(bus, store, "JOBS")
        self.nodes = Projector(bus, store, "NODES")
        self.specs: dict[str, JobSpec] = {}

    def cycle(self, clock: float = NOW, **kwargs: object) -> PlacementCycle:
        return PlacementCycle(
            self.bus, self.store, self.jobs, CLUSTER, lambda: clock, node_projector=(self.nodes,), **kwargs
        )  # type: ignore[arg-type]

    async def node(self, node_id: str, rack: str = "r1", gpus: int = 8, state: str = "healthy") -> None:
        info = NodeInfo(node_id=node_id, cluster=CLUSTER, gpu_type="H100", gpus=gpus, rack=rack)
        subject = subjects.node(CLUSTER, node_id)
        await self.bus.publish(subject, NodeRegistered(at=NOW - 1000, node=info, boot_id="b1"), msg_id=f"reg-{node_id}")
        if state != "healthy":
            change = NodeStateChanged(
                at=NOW - 900, node_id=node_id, cluster=CLUSTER, state=state, previous="healthy", reason="operator"
            )
            await self.bus.publish(subject, change, msg_id=f"state-{node_id}")

    async def submit(self, job_id: str, spec: JobSpec, admit: bool = True) -> None:
        self.specs[job_id] = spec
        accepted = JobAccepted(at=NOW - 500, job_id=job_id, spec=spec, submitted_at=NOW - 500)
        await publish_event(self.bus, accepted, msg_id=f"{job_id}:acc")
        if admit:
            await self.admit(job_id)

    async def admit(self, job_id: str, at: float = NOW - 400) -> None:
        tenant = self.specs[job_id].tenant
        event = JobAdmitted(at=at, job_id=job_id, tenant=tenant, run_id=f"{job_id}-r1", attempt=1)
        await publish_event(self.bus, event, msg_id=f"{job_id}:adm")

    async def running(
        self, job_id: str, spec: JobSpec, on: dict[str, list[int]], started_at: float, admitted_at: float = NOW - 400
    ) -> None:
        """A job that already holds GPUs (admitted at ``admitted_at``, placed and started at ``started_at``)."""
        await self.submit(job_id, spec, admit=False)
        await self.admit(job_id, min(admitted_at, started_at))
        replicas = [
            ReplicaPlacement(role="trainer", replica=i, rank=i, node_id=node, gpus=gpus)
            for i, (node, gpus) in enumerate(on.items())
        ]
        run = f"{job_id}-r1"
        tenant = spec.tenant
        placed = JobPlaced(at=started_at, job_id=job_id, tenant=tenant, run_id=run, cluster=CLUSTER, replicas=replicas)
        await publish_event(self.bus, placed, msg_id=f"{run}:placed")
        started = RunStarted(at=started_at, job_id=job_id, tenant=tenant, run_id=run)
        await publish_event(self.bus, started, msg_id=f"{run}:started")

    async def finish(self, job_id: str, run_id: str) -> None:
        tenant = self.specs[job_id].tenant
        started = RunStarted(at=NOW, job_id=job_id, tenant=tenant, run_id=run_id)
        await publish_event(self.bus, started, msg_id=f"{run_id}:started")
        done = RunSucceeded(at=NOW, job_id=job_id, tenant=tenant, run_id=run_id)
        await publish_event(self.bus, done, msg_id=f"{run_id}:done")

    async def settle(self) -> None:
        await self.jobs.caught_up()
        await self.nodes.caught_up()


@asynccontextmanager
async def harness(bus: Bus, store: Store) -> AsyncIterator[Harness]:
    h = Harness(bus, store)
    stop = asyncio.Event()
    tasks = [asyncio.create_task(h.jobs.run(stop)), asyncio.create_task(h.nodes.run(stop))]
    try:
        yield h
    finally:
        stop.set()
        await asyncio.gather(*tasks)


class Case(msgspec.Struct):
    nodes: list[tuple[str, str, str]]  # (node id, rack, state)
    running: list[tuple[str, JobSpec, dict[str, list[int]], float]]  # (job id, spec, GPUs by node, started)
    waiting: list[tuple[str, JobSpec]]  # admitted, in this order
    placed_in: dict[str, set[str]] = {}  # job id -> the racks (or, prefixed "node:", nodes) it must land in
    waits: dict[str, str] = {}  # job id -> the reason it is left waiting
    expected_start: dict[str, float] = {}  # job id -> its reservation's start
    backfilled: int = 0


ALL8 = list(range(8))


def rack(name: str, n: int, first: int = 0, state: str = "healthy") -> list[tuple[str, str, str]]:
    return [(f"{name}n{i}", name, state) for i in range(first, first + n)]


CASES = [
    pytest.param(
        Case(
            nodes=rack("r1", 4) + rack("r2", 4) + rack("r3", 4),
            running=[
                ("busy1", job(8), {"r1n0": ALL8}, NOW - 10),
                ("busy2", job(8), {"r1n1": ALL8}, NOW - 10),
                ("busy3", job(8), {"r3n0": ALL8}, NOW - 10),
            ],
            waiting=[("gang", job(8, replicas=4))],
            placed_in={"gang": {"r2"}},
        ),
        id="a 4x8 gang lands in the one rack that has 4 free nodes",
    ),
    pytest.param(
        Case(
            nodes=rack("r1", 4) + rack("r2", 4),
            running=[("busy1", job(8), {"r1n0": ALL8}, NOW - 10), ("busy2", job(8), {"r2n0": ALL8}, NOW - 10)],
            waiting=[("gang", job(8, replicas=4))],
            placed_in={"gang": {"r1", "r2"}},
        ),
        id="a 4x8 gang spans two racks when no rack has 4 free nodes",
    ),
    pytest.param(
        Case(
            nodes=rack("r1", 2),
            running=[("long", job(8, max_runtime_s=1000), {"r1n0": ALL8}, NOW - 100)],
            waiting=[("large", job(8, replicas=2)), ("small", job(8, max_runtime_s=600))],
            placed_in={"small": {"node:r1n1"}},
            waits={"large": "insufficient_gpus"},
            expected_start={"large": NOW + 900},
            backfilled=1,
        ),
        id="a small job that ends before the large gang's reservation backfills",
    ),
    pytest.param(
        Case(
            nodes=rack("r1", 2),
            running=[("long", job(8, max_runtime_s=1000), {"r1n0": ALL8}, NOW - 100)],
            waiting=[("large", job(8, replicas=2)), ("small", job(8, max_runtime_s=1200))],
            waits={"large": "insufficient_gpus", "small": "reserved_for_larger_job"},
            expected_start={"large": NOW + 900},
        ),
        id="a small job that would outlast the large gang's reservation waits",
    ),
    pytest.param(
        Case(
            nodes=rack("r1", 1, state="cordoned") + rack("r1", 1, first=1) + rack("r1", 1, first=2, state="draining"),
            running=[],
            waiting=[("first", job(8)), ("second", job(8)), ("third", job(1))],
            placed_in={"first": {"node:r1n1"}},
            waits={"second": "insufficient_gpus", "third": "insufficient_gpus"},
            expected_start={"second": NOW + 3600},  # when "first" must end, at the latest
        ),
        id="cordoned and draining nodes take no work",
    ),
]


@pytest.mark.parametrize("case", CASES)
async def test_the_cycle_places_from_the_projection(bus: Bus, store: Store, case: Case) -> None:
    async with harness(bus, store) as h:
        for node_id, rack_name, state in case.nodes:
            await h.node(node_id, rack_name, state=state)
        for job_id, spec, on, started in case.running:
            await h.running(job_id, spec, on, started)
        for job_id, spec in case.waiting:
            await h.submit(job_id, spec)
        await h.settle()
        cycle = h.cycle()

        snap = await cycle.snapshot()
        assert {(a.job_id, a.started_at, a.max_runtime_s) for a in snap.cluster.running} == {
            (j, started, float(spec.max_runtime_s)) for j, spec, _, started in case.running
        }
        assert await cycle.run_once() == len(case.placed_in)
        await h.settle()

        for job_id, where in case.placed_in.items():
            view = await views.get_job(store, job_id)
            assert view is not None and view.status == "placed" and view.placement
            by_node = any(w.startswith("node:") for w in where)
            landed = {f"node:{r.node_id}" if by_node else r.node_id[:2] for r in view.placement}
            assert landed == where
        waiting_jobs = await views.get_jobs(store, [job_id for job_id, _ in case.waiting])
        why = await waiting.read(store, waiting_jobs)
        assert {j.job_id: j.status for j in waiting_jobs if j.job_id in case.waits} == dict.fromkeys(
            case.waits, "admitted"
        )
        assert {j: w.reason for j, w in why.items() if j in case.waits} == case.waits
        for job_id, _ in case.waiting:
            outlook = why.get(job_id)
            assert (outlook.expected_start if outlook else None) == case.expected_start.get(job_id)
        assert cycle.stats.backfilled == case.backfilled
        assert cycle.stats.reservations == len(case.expected_start)
        assert await views.violations(store) == []


async def test_running_jobs_are_read_once_and_forgotten_when_they_end(bus: Bus, store: Store) -> None:
    async with harness(bus, store) as h:
        for node_id, rack_name, _ in rack("r1", 2):
            await h.node(node_id, rack_name)
        await h.running("a", job(8), {"r1n0": ALL8}, NOW - 10)
        await h.running("b", job(4), {"r1n1": [0, 1, 2, 3]}, NOW - 20)
        await h.settle()
        cycle = h.cycle()
        snap = await cycle.snapshot()
        assert sorted(a.run_id for a in snap.cluster.running) == ["a-r1", "b-r1"]
        assert sorted(cycle._replicas) == ["a-r1", "b-r1"]
        await h.finish("a", "a-r1")
        await h.settle()
        snap = await cycle.snapshot()
        assert [a.run_id for a in snap.cluster.running] == ["b-r1"]
        assert sorted(cycle._replicas) == ["b-r1"] and sorted(cycle._specs) == ["b"]


async def test_why_a_gang_waits_is_kept_beside_its_record_and_forgotten_once_it_is_placed(
    bus: Bus, store: Store
) -> None:
    async with harness(bus, store) as h:
        await h.node("n1")
        await h.running("a", job(8, max_runtime_s=1000), {"n1": ALL8}, NOW - 100)
        await h.submit("big", job(8))
        await h.settle()
        cycle = h.cycle()
        await cycle.run_once()
        why = await waiting.read(store, await views.get_jobs(store, ["a", "big"]))
        assert set(why) == {"big"} and why["big"].expected_start == NOW + 900
        assert set(await store.redis.hkeys(store.key("job", "big"))) <= set(job_hash.FIELDS)
        await h.finish("a", "a-r1")
        await h.settle()
        assert await cycle.run_once() == 1
        await h.settle()
        assert (await views.get_job(store, "big")).status == "placed"
        assert await store.redis.hkeys(store.key("why", "admitted")) == []
