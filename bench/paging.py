"""Walk every job through ``GET /v1/jobs``, page by page, with its cursor.

Seeds a real JetStream with ``--jobs`` jobs (two tenants, every third one
cancelled; :mod:`trainyard.testing.job_seeding`), projects them into a real
Redis with the gateway's own projector, serves the gateway's app over HTTP on
loopback, and walks the whole list as an admin in pages of ``--page`` jobs,
then the tenant ``acme``'s cancelled jobs (a status index) and one hour of
submissions (a filter checked on each job).  Prints each walk's pages, total
time and pages/s, and checks every walk returned each job once.

    python bench/paging.py [--jobs 100000] [--page 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from trainyard.bus import Bus, ensure_streams
from trainyard.local.servers import free_port, start_nats, start_redis
from trainyard.store import Store
from trainyard.testing import job_seeding as seeding
from trainyard.testing.auth import issue
from trainyard_gateway.jobs import JobOperations
from trainyard_gateway.rest import create_app


async def walk(
    client: httpx.AsyncClient, headers: dict[str, str], params: dict[str, Any]
) -> tuple[list[str], int, float]:
    """Every job id of the list, how many pages, and the seconds the walk took."""
    ids: list[str] = []
    pages = 0
    cursor = None
    start = time.perf_counter()
    while True:
        answer = await client.get("/v1/jobs", params={**params, "cursor": cursor}, headers=headers)
        assert answer.status_code == 200, answer.text[:300]
        body = answer.json()
        ids += [j["job_id"] for j in body["jobs"]]
        pages += 1
        cursor = body["next_cursor"]
        if cursor is None:
            return ids, pages, time.perf_counter() - start


async def main(n_jobs: int, page: int) -> None:
    with tempfile.TemporaryDirectory(prefix="trainyard-bench-") as tmp:
        nats, redis = start_nats(Path(tmp) / "nats"), start_redis(Path(tmp) / "redis")
        bus = await Bus.connect(nats.url, "bench")
        await ensure_streams(bus.js)
        store = Store.from_url(redis.url)
        try:
            t0 = time.perf_counter()
            projector, stop, task = seeding.run_projector(bus, store)
            await seeding.publish_jobs(bus, 0, n_jobs)
            await seeding.fold_all(bus, store, projector)
            print(f"seeded and projected {n_jobs:,} jobs in {time.perf_counter() - t0:.1f}s")

            callers = await issue(bus)
            app = create_app(JobOperations(bus, store), store, callers.authenticator)
            port = free_port()
            server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
            serving = asyncio.create_task(server.serve())
            while not server.started:
                await asyncio.sleep(0.05)

            hour = {
                "submitted_after": seeding.SUBMITTED_AT + n_jobs // 2,
                "submitted_before": seeding.SUBMITTED_AT + n_jobs // 2 + 3600,
            }
            walks = [
                ("every job", {}, n_jobs),
                ("acme, cancelled", {"tenant": "acme", "status": "cancelled"}, len(range(0, n_jobs, 6))),
                ("one hour of submissions", hour, min(3600, n_jobs - n_jobs // 2)),
            ]
            print(f"\n{'walk':<26} {'page':>6} {'jobs':>9} {'pages':>7} {'total s':>9} {'pages/s':>9} {'jobs/s':>10}")
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
                for name, params, expected in walks:
                    ids, pages, seconds = await walk(client, callers.headers("admin"), {"limit": page, **params})
                    assert len(ids) == len(set(ids)) == expected, (name, len(ids), len(set(ids)), expected)
                    print(
                        f"{name:<26} {page:>6} {len(ids):>9,} {pages:>7} {seconds:>9.2f} "
                        f"{pages / seconds:>9.1f} {len(ids) / seconds:>10,.0f}",
                        flush=True,
                    )
            server.should_exit = True
            await serving
            stop.set()
            await task
        finally:
            await bus.close()
            await store.close()
            nats.stop()
            redis.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--page", type=int, default=1000, help="jobs per page (1-1000)")
    args = parser.parse_args()
    asyncio.run(main(args.jobs, args.page))
