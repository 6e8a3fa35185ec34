"""Time to render each console page with 10,000 jobs and 512 nodes in the
projections.

Seeds a real JetStream with 512 nodes (16 racks of 32 in 2 blocks) and 10,000
jobs (8,000 finished, 1,000 running on the nodes, 1,000 pending), projects
them into a real Redis with the gateway's own projector, folds the same events
into a SQLite ledger as accounting would, then asks the gateway's app (with
the console mounted, as the gateway serves it) for each page as each role
would, over HTTP on loopback, and prints the median and worst time per page.

    python bench/console.py [--jobs 10000] [--nodes 512] [--repeat 20]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import socket
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import uvicorn

from trainyard.bus import Bus, PublishRequest, ensure_streams
from trainyard.domain import JobSpec, NodeInfo, Role
from trainyard.events import (
    JobAccepted,
    JobAdmitted,
    JobPlaced,
    NodeRegistered,
    RunStarted,
    RunSucceeded,
    decode_job_event,
    job_subject,
    subjects,
)
from trainyard.events.jobs import ReplicaPlacement
from trainyard.local.servers import start_nats, start_redis
from trainyard.settings import Settings
from trainyard.store import Projector, Store
from trainyard.testing.auth import issue
from trainyard.testing.streams import read_raw
from trainyard_accounting.writer import LedgerWriter
from trainyard_gateway import finance_api, nodes_api
from trainyard_gateway.console import app as console_app
from trainyard_gateway.jobs import JobOperations
from trainyard_gateway.rest import create_app

TENANTS = ("acme", "globex", "initech", "umbrella", "hooli", "stark", "wayne", "tyrell")
NODES_PER_RACK = 32


async def publish_all(bus: Bus, requests: list[PublishRequest], chunk: int = 2000) -> None:
    for i in range(0, len(requests), chunk):
        for r in await bus.publish_many(requests[i : i + chunk]):
            if isinstance(r, Exception):
                raise r


def fleet(n: int) -> list[NodeInfo]:
    return [
        NodeInfo(
            node_id=f"n{i:04d}",
            cluster="bench",
            gpu_type="H100",
            gpus=8,
            zone="z1",
            block=f"b{i // (NODES_PER_RACK * 8) + 1}",
            rack=f"r{i // NODES_PER_RACK + 1:02d}",
        )
        for i in range(n)
    ]


def job_events(n_jobs: int, nodes: list[NodeInfo], now: float) -> list[PublishRequest]:
    """8/10 finished, 1/10 running (one node each), 1/10 pending, spread over the last 30 days."""
    rng = random.Random(11)
    out: list[PublishRequest] = []
    running = n_jobs // 10
    node_slots = [(node.node_id, half) for node in nodes for half in (0, 1)]  # two 4-GPU runs per node
    for i in range(n_jobs):
        tenant = TENANTS[i % len(TENANTS)]
        job_id = f"j{i:05d}"
        at = now - 30 * 86_400 + i * (30 * 86_400 - 600) / n_jobs
        spec = JobSpec(
            tenant=tenant,
            queue="default",
            name=f"train-{i}",
            roles=[Role(name="t", gpus_per_replica=4)],
            simulated_duration_s=3600.0,
        )

        def add(event, name: str, writer: str | None = None) -> None:  # type: ignore[no-untyped-def]
            out.append(PublishRequest(job_subject(event, writer), event, f"{event.job_id}:{name}"))

        add(JobAccepted(at=at, job_id=job_id, spec=spec, submitted_at=at), "accepted")
        kind = (
            "pending" if i >= n_jobs - n_jobs // 10 else "running" if i >= n_jobs - running - n_jobs // 10 else "done"
        )
        if kind == "pending":
            continue
        run_id = f"{job_id}-r1"
        slot = node_slots[i % len(node_slots)] if kind == "running" else node_slots[rng.randrange(len(node_slots))]
        gpus = [4 * slot[1] + g for g in range(4)]
        add(JobAdmitted(at=at + 1, job_id=job_id, tenant=tenant, run_id=run_id, attempt=1), "admitted")
        add(
            JobPlaced(
                at=at + 2,
                job_id=job_id,
                tenant=tenant,
                run_id=run_id,
                cluster="bench",
                replicas=[ReplicaPlacement(role="t", replica=0, rank=0, node_id=slot[0], gpus=gpus)],
            ),
            "placed",
        )
        add(RunStarted(at=at + 3, job_id=job_id, tenant=tenant, run_id=run_id), "started", "agent")
        if kind == "done":
            add(
                RunSucceeded(at=at + 3 + rng.uniform(60, 7200), job_id=job_id, tenant=tenant, run_id=run_id),
                "succeeded",
                "agent",
            )
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def main(n_jobs: int, n_nodes: int, repeat: int) -> None:
    with tempfile.TemporaryDirectory(prefix="trainyard-bench-") as tmp:
        nats, redis = start_nats(Path(tmp) / "nats"), start_redis(Path(tmp) / "redis")
        bus = await Bus.connect(nats.url, "bench")
        await ensure_streams(bus.js)
        store = Store.from_url(redis.url)
        server = None
        try:
            t0 = time.perf_counter()
            nodes = fleet(n_nodes)
            await publish_all(
                bus,
                [
                    PublishRequest(
                        subjects.node("bench", n.node_id), NodeRegistered(at=0.0, node=n, boot_id="b"), n.node_id
                    )
                    for n in nodes
                ],
            )
            await publish_all(bus, job_events(n_jobs, nodes, time.time()))
            stop = asyncio.Event()
            projectors = [Projector(bus, store, "JOBS"), Projector(bus, store, "NODES")]
            tasks = [asyncio.create_task(p.run(stop)) for p in projectors]
            for p in projectors:
                await p.caught_up(timeout=600)
            ledger_url = f"sqlite:///{tmp}/ledger.db"
            ledger = LedgerWriter(ledger_url)
            ledger.create_schema()
            raw = await read_raw(bus, "JOBS")
            for i in range(0, len(raw), 5000):
                ledger.apply([(str(seq), decode_job_event(data)) for seq, _, data in raw[i : i + 5000]])
            print(
                f"seeded {n_jobs:,} jobs and {n_nodes:,} nodes ({len(raw):,} job events, projected and metered) "
                f"in {time.perf_counter() - t0:.1f}s"
            )

            callers = await issue(bus)
            settings = Settings(ledger_url=ledger_url)
            ops = JobOperations(bus, store)
            routers = [
                nodes_api.build_router(bus, store, settings),
                finance_api.build_router(bus, store, settings),
                console_app.build_router(ops, store, callers.authenticator, settings),
            ]
            app = create_app(ops, store, callers.authenticator, routers=routers)
            port = free_port()
            server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
            serving = asyncio.create_task(server.serve())
            while not server.started:
                await asyncio.sleep(0.05)

            pages = [  # (caller, path)
                ("acme", "/jobs"),
                ("admin", "/jobs"),
                ("admin", "/jobs?status=running"),
                ("acme", "/jobs/new"),
                ("admin", f"/jobs/j{n_jobs - n_jobs // 10 - 1:05d}"),
                ("acme", "/jobs/j00000"),
                ("operator", "/cluster"),
                ("operator", "/nodes"),
                ("operator", "/nodes/n0001"),
                ("finance", "/usage"),
                ("finance", f"/finance/chargeback?period={time.strftime('%Y-%m', time.gmtime())}"),
                ("finance", "/finance/capacity"),
            ]
            print(f"\n{'page':<42} {'as':<9} {'p50 ms':>8} {'max ms':>8} {'bytes':>9}")
            for caller, path in pages:
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
                    form = (await client.get("/login")).text  # its form's CSRF token goes with the token
                    csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', form)
                    assert csrf, "the login page has no CSRF token"
                    login = await client.post("/login", data={"token": callers.tokens[caller], "csrf": csrf.group(1)})
                    assert login.status_code == 303, login.text
                    times, size = [], 0
                    for _ in range(repeat):
                        start = time.perf_counter()
                        r = await client.get(path)
                        times.append(time.perf_counter() - start)
                        assert r.status_code == 200, (path, r.status_code, r.text[:300])
                        size = len(r.content)
                print(
                    f"{path:<42} {caller:<9} {statistics.median(times) * 1000:>8.0f} {max(times) * 1000:>8.0f} {size:>9,}",
                    flush=True,
                )
            server.should_exit = True
            await serving
            stop.set()
            await asyncio.gather(*tasks)
        finally:
            await bus.close()
            await store.close()
            nats.stop()
            redis.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    asyncio.run(main(args.jobs, args.nodes, args.repeat))
