"""The run dispatcher against a locked nats-server and Redis: admission and
placement publish as themselves, the dispatcher runs as placement, and each
fake node agent reads its own orders and reports with its own credential
(``agent-<node>``), as a scripted test says."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

from trainyard.bus import Bus
from trainyard.domain import JobSpec, NodeInfo, Role
from trainyard.events import (
    JobAccepted,
    JobAdmitted,
    JobEvent,
    JobPlaced,
    NodeRegistered,
    ReplicaPlacement,
    decode_job_event,
    subjects,
)
from trainyard.events.work import CheckpointWritten, ProcessesStarted, ProcessExited, StartRun, WorkOrder, decode_work
from trainyard.store import Projector, Store, views
from trainyard.testing.locked_bus import locked_bus
from trainyard.testing.publish import publish_event
from trainyard.testing.streams import read_raw
from trainyard.testing.waiting import eventually
from trainyard_placement.dispatch import RunDispatcher
from trainyard_placement.handlers import Leadership

CLUSTER = "local"
NODES = ("n01", "n02", "n03")


def spec(replicas: int = 3, **fields: object) -> JobSpec:
    return JobSpec(
        tenant="acme",
        queue="default",
        roles=[Role(name="trainer", replicas=replicas, gpus_per_replica=1)],
        command=["python", "train.py"],
        **fields,  # type: ignore[arg-type]
    )


class FakeAgent:
    """One node's agent, as a test scripts it: its orders as they come, its reports when told."""

    def __init__(self, node_id: str, bus: Bus) -> None:
        self.node_id = node_id
        self.bus = bus
        self.orders: list[WorkOrder] = []
        self._sub = None
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        self._sub = await self.bus.js.pull_subscribe(
            subjects.work_orders(CLUSTER, self.node_id), durable=f"agent-{self.node_id}", stream="WORK"
        )
        self._task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        assert self._sub is not None
        while True:
            try:
                msgs = await self._sub.fetch(16, timeout=0.5)
            except TimeoutError:
                continue
            for msg in msgs:
                order = decode_work(msg.data)
                assert not isinstance(order, ProcessesStarted | ProcessExited | CheckpointWritten)
                self.orders.append(order)
                await msg.ack()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def of(self, kind: type) -> list:
        return [o for o in self.orders if isinstance(o, kind)]

    async def report(self, report: object, msg_id: str) -> None:
        await self.bus.publish(subjects.work_reports(CLUSTER, self.node_id), report, msg_id=msg_id)

    async def started(self, run: StartRun, at: float | None = None) -> None:
        ranks = [p.rank for p in run.processes]
        await self.report(
            ProcessesStarted(
                at=time.time() if at is None else at,
                job_id=run.job_id,
                tenant=run.tenant,
                run_id=run.run_id,
                node_id=self.node_id,
                ranks=ranks,
                pids=[1000 + r for r in ranks],
            ),
            f"{run.run_id}:{self.node_id}:started",
        )

    async def exited(self, run: StartRun, rank: int, **how: object) -> None:
        await self.report(
            ProcessExited(
                at=time.time(), job_id=run.job_id, tenant=run.tenant, run_id=run.run_id, node_id=self.node_id,
                rank=rank, **how,  # type: ignore[arg-type]
            ),
            f"{run.run_id}:{self.node_id}:exit:{rank}",
        )  # fmt: skip


class Cluster:
    """The locked bus, the projections, the dispatcher and a fake agent per node."""

    def __init__(self, connect, store: Store) -> None:  # type: ignore[no-untyped-def]
        self.connect = connect
        self.store = store
        self.agents: dict[str, FakeAgent] = {}
        self.tasks: list[asyncio.Task] = []
        self.stop = asyncio.Event()

    async def start(
        self, start_timeout_s: float = 60.0, emulated: tuple[str, ...] = (), lease: Leadership | None = None
    ) -> None:
        self.admission: Bus = await self.connect("admission")
        self.placement: Bus = await self.connect("placement")
        self.admin: Bus = await self.connect("admin")
        for node in NODES:
            agent = FakeAgent(node, await self.connect(f"agent-{node}"))
            info = NodeInfo(
                node_id=node,
                cluster=CLUSTER,
                gpu_type="H100",
                gpus=8,
                address=f"10.0.0.{node[-1]}",
                executes=node not in emulated,
            )
            await agent.bus.publish(
                subjects.node(CLUSTER, node), NodeRegistered(at=time.time(), node=info, boot_id="b1"), f"reg-{node}"
            )
            await agent.start()
            self.agents[node] = agent
        self.jobs = Projector(self.placement, self.store, "JOBS")
        nodes = Projector(self.placement, self.store, "NODES")
        self.dispatcher = RunDispatcher(
            self.placement, self.store, CLUSTER, time.time, lease=lease, start_timeout_s=start_timeout_s
        )
        self.tasks = [asyncio.ensure_future(c) for c in (self.jobs.run(self.stop), nodes.run(self.stop))]
        self._dispatching = asyncio.Event()
        self._dispatcher = asyncio.ensure_future(self.dispatcher.run(self._dispatching))

    async def restart_dispatcher(self) -> None:
        """Stop the dispatcher and start a new one (a restart, or a standby taking over): it keeps nothing in memory."""
        self._dispatching.set()
        await self._dispatcher
        old = self.dispatcher
        self.dispatcher = RunDispatcher(old.bus, old.store, CLUSTER, time.time, start_timeout_s=old.start_timeout_s)
        self._dispatching = asyncio.Event()
        self._dispatcher = asyncio.ensure_future(self.dispatcher.run(self._dispatching))

    async def close(self) -> None:
        self.stop.set()
        if self.tasks:
            self._dispatching.set()
            self.tasks.append(self._dispatcher)
        for agent in self.agents.values():
            await agent.stop()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def place(self, job_id: str, job: JobSpec, nodes: tuple[str, ...] = NODES, first_gpu: int = 0) -> str:
        """Accept, admit and place ``job`` with replica rank i on ``nodes[i]`` (GPU ``first_gpu + i``)."""
        run_id = f"{job_id}-r1"
        now = time.time()
        await publish_event(
            self.admission, JobAccepted(at=now, job_id=job_id, spec=job, submitted_at=now), f"{job_id}:a"
        )
        admitted = JobAdmitted(at=now, job_id=job_id, tenant=job.tenant, run_id=run_id, attempt=1)
        await publish_event(self.admission, admitted, f"{job_id}:adm")
        replicas = [
            ReplicaPlacement(role="trainer", replica=i, rank=i, node_id=n, gpus=[first_gpu + i])
            for i, n in enumerate(nodes)
        ]
        placed = JobPlaced(
            at=time.time(), job_id=job_id, tenant=job.tenant, run_id=run_id, cluster=CLUSTER, replicas=replicas
        )
        await publish_event(self.placement, placed, f"{run_id}:placed")
        return run_id

    async def start_orders(self, run_id: str) -> dict[str, StartRun]:
        """Each node's StartRun of ``run_id``, once every agent has it."""

        async def all_there() -> dict[str, StartRun] | None:
            found = {n: o for n, a in self.agents.items() for o in a.of(StartRun) if o.run_id == run_id}
            return found if len(found) == len(self.agents) else None

        return await eventually(all_there, what=f"a StartRun of {run_id} on every node")

    async def events(self, job_id: str) -> list[tuple[str, JobEvent]]:
        """Every JOBS event of ``job_id``, with its writer."""
        raw = await read_raw(self.admin, "JOBS")
        return [
            (subject.rsplit(".", 1)[1], decode_job_event(data))
            for _, subject, data in raw
            if subjects.entity_id(subject) == job_id
        ]

    async def of(self, job_id: str, kind: type) -> list:
        return [e for _, e in await self.events(job_id) if isinstance(e, kind)]

    async def status(self, job_id: str) -> str | None:
        job = await views.get_job(self.store, job_id)
        return None if job is None else job.status


@contextlib.asynccontextmanager
async def dispatching(directory: Path, store: Store) -> AsyncIterator[Cluster]:
    """A locked bus with an agent user per node, and a :class:`Cluster` on it (started by the test)."""
    async with locked_bus(directory, tenants=("acme",), cluster=CLUSTER, agents=NODES) as (connect, _):
        c = Cluster(connect, store)
        try:
            yield c
        finally:
            await c.close()
