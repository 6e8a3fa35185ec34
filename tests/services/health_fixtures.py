"""Builders for the health service tests: a registered fleet, runs placed on
it, and a health monitor wired to real NATS and Redis."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from trainyard.bus import Bus
from trainyard.core.health import HealthPolicy
from trainyard.domain import JobSpec, Role
from trainyard.domain.node import NodeInfo
from trainyard.events import (
    JobAccepted,
    JobAdmitted,
    JobPlaced,
    NodeRegistered,
    ReplicaPlacement,
    RunStarted,
    decode_job_event,
    decode_node_event,
    subjects,
)
from trainyard.store import Projector, Store
from trainyard.testing.publish import publish_event
from trainyard.testing.streams import read_raw
from trainyard_health.metrics import HealthMetrics
from trainyard_health.monitor import Monitor

CLUSTER = "c1"


def fleet(count: int = 8, racks: int = 2, gpus: int = 8) -> list[NodeInfo]:
    per_rack = count // racks
    return [
        NodeInfo(node_id=f"n{i}", cluster=CLUSTER, gpu_type="H100", gpus=gpus, rack=f"r{i // per_rack + 1}")
        for i in range(count)
    ]


class Harness:
    def __init__(self, bus: Bus, store: Store, monitor: Monitor, nodes: Projector, jobs: Projector) -> None:
        self.bus, self.store, self.monitor = bus, store, monitor
        self.nodes_projector, self.jobs_projector = nodes, jobs

    async def register(self, infos: list[NodeInfo]) -> None:
        seq = 0
        for info in infos:
            ack = await self.bus.publish(
                subjects.node(CLUSTER, info.node_id),
                NodeRegistered(at=time.time(), node=info, boot_id="b1"),
                msg_id=f"reg:{info.node_id}",
            )
            seq = ack.seq
        await self.nodes_projector.wait_for(seq)

    async def run_job(self, job_id: str, nodes: list[str], gpus_per_node: int = 8, tenant: str = "acme") -> str:
        """A job placed and running with one replica on each of ``nodes``; returns its run id."""
        role = Role(name="w", replicas=len(nodes), gpus_per_replica=gpus_per_node)
        spec = JobSpec(tenant=tenant, queue="default", roles=[role])
        run_id = f"{job_id}-r1"
        now = time.time()
        replicas = [
            ReplicaPlacement(role="w", replica=i, rank=i, node_id=n, gpus=list(range(gpus_per_node)))
            for i, n in enumerate(nodes)
        ]
        for i, event in enumerate(
            [
                JobAccepted(at=now, job_id=job_id, spec=spec, submitted_at=now),
                JobAdmitted(at=now, job_id=job_id, tenant=tenant, run_id=run_id, attempt=1),
                JobPlaced(at=now, job_id=job_id, tenant=tenant, run_id=run_id, cluster=CLUSTER, replicas=replicas),
                RunStarted(at=now, job_id=job_id, tenant=tenant, run_id=run_id),
            ]
        ):
            ack = await publish_event(self.bus, event, msg_id=f"{run_id}:{i}")
        await self.jobs_projector.wait_for(ack.seq)
        return run_id

    async def state(self, node_id: str) -> str | None:
        await self.nodes_projector.wait_for((await self.bus.js.stream_info("NODES")).state.last_seq)
        return await self.store.redis.hget(self.store.key("nodestate"), node_id)

    async def job_events(self) -> list:
        return [decode_job_event(d) for _, _, d in await read_raw(self.bus, "JOBS")]

    async def node_events(self) -> list:
        return [decode_node_event(d) for _, _, d in await read_raw(self.bus, "NODES")]

    async def audit_actions(self) -> list[str]:
        import msgspec

        return [msgspec.json.decode(d)["action"] for _, _, d in await read_raw(self.bus, "AUDIT")]


@asynccontextmanager
async def harness(bus: Bus, store: Store, policy: HealthPolicy | None = None, nodes: int = 8) -> AsyncIterator[Harness]:
    stop = asyncio.Event()
    node_projector, job_projector = Projector(bus, store, "NODES"), Projector(bus, store, "JOBS")
    tasks = [asyncio.create_task(node_projector.run(stop)), asyncio.create_task(job_projector.run(stop))]
    monitor = Monitor(bus, store, policy or HealthPolicy(), time.time, metrics=HealthMetrics(), nodes=node_projector)
    h = Harness(bus, store, monitor, node_projector, job_projector)
    try:
        await h.register(fleet(nodes))
        yield h
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
