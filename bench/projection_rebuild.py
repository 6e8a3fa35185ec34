"""Projection rebuild benchmark: how long after a FLUSHALL is the job
projection whole again?

Starts a real nats-server (JetStream) and a real Redis, publishes ~20,000
jobs' lifecycles (accepted, admitted, placed, started, succeeded: 100,000
events) to JOBS through the bus, lets a running JOBS projector catch up,
then FLUSHALLs Redis and times until the projection holds the stream head
again under a new epoch (the projector notices the loss by itself, then
replays the stream).  Checks the rebuilt projection against the one before
the wipe.

    .venv/bin/python bench/projection_rebuild.py [--events 100000] [--wipes 3] [--batch 512]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from trainyard.bus import Bus, PublishRequest, ensure_streams
from trainyard.domain import JobSpec, Role
from trainyard.events import (
    JobAccepted,
    JobAdmitted,
    JobPlaced,
    ReplicaPlacement,
    RunStarted,
    RunSucceeded,
    job_subject,
)
from trainyard.local.servers import start_nats, start_redis
from trainyard.store import Projector, Store
from trainyard.store.projector import wait_until_projected

NODES = 1000


def lifecycle(j: int, at: float | None = None, run_s: float = 60.0) -> list[PublishRequest]:
    """Job ``j``'s events from acceptance to success, accepted at ``at``
    (default: a time of its own long ago) and running for ``run_s``."""
    job_id, run_id, tenant = f"j{j:06d}", f"j{j:06d}-r1", f"t{j % 8}"
    spec = JobSpec(tenant=tenant, queue="default", roles=[Role(name="trainer", replicas=1, gpus_per_replica=1)])
    placed = [ReplicaPlacement(role="trainer", replica=0, rank=0, node_id=f"n{j % NODES:04d}", gpus=[j // NODES % 8])]
    at = 1_700_000_000.0 + j if at is None else at
    events = [
        JobAccepted(at=at, job_id=job_id, spec=spec, submitted_at=at),
        JobAdmitted(at=at + 1, job_id=job_id, tenant=tenant, run_id=run_id, attempt=1),
        JobPlaced(at=at + 2, job_id=job_id, tenant=tenant, run_id=run_id, cluster="c1", replicas=placed),
        RunStarted(at=at + 3, job_id=job_id, tenant=tenant, run_id=run_id),
        RunSucceeded(at=at + run_s, job_id=job_id, tenant=tenant, run_id=run_id),
    ]
    return [PublishRequest(job_subject(e), e, f"{run_id}:{i}") for i, e in enumerate(events)]


async def fill(bus: Bus, events: int) -> int:
    jobs = events // 5
    for start in range(0, jobs, 400):
        requests = [r for j in range(start, min(jobs, start + 400)) for r in lifecycle(j)]
        for result in await bus.publish_many(requests):
            if isinstance(result, Exception):
                raise result
    return (await bus.js.stream_info("JOBS")).state.last_seq


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        nats, redis = start_nats(Path(tmp) / "nats"), start_redis(Path(tmp) / "redis")
        bus = await Bus.connect(nats.url, name="bench-rebuild")
        store = Store.from_url(redis.url)
        try:
            await ensure_streams(bus.js)
            t0 = time.perf_counter()
            head = await fill(bus, args.events)
            print(f"published {head} events ({args.events // 5} jobs) in {time.perf_counter() - t0:.1f} s")
            projector = Projector(bus, store, "JOBS")
            stop = asyncio.Event()
            task = asyncio.create_task(projector.run(stop, batch_size=args.batch))
            t0 = time.perf_counter()
            await projector.caught_up(timeout=600)
            print(f"first projection: {time.perf_counter() - t0:.2f} s")
            before = await store.redis.hgetall(store.key("counts"))
            times = []
            for _ in range(args.wipes):
                epoch = projector.epoch
                t0 = time.perf_counter()
                await store.redis.flushall()
                await wait_until_projected(bus, store, "JOBS", seq=head, timeout=600)
                times.append(time.perf_counter() - t0)
                assert projector.epoch != epoch, "the wipe went unnoticed"
                assert await store.redis.hgetall(store.key("counts")) == before, "rebuilt projection differs"
            stop.set()
            await task
            print(
                f"whole again after a FLUSHALL at {head} events: "
                f"median {statistics.median(times):.2f} s, max {max(times):.2f} s over {len(times)} wipes"
            )
        finally:
            await store.close()
            await bus.close()
            nats.stop()
            redis.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--wipes", type=int, default=3)
    parser.add_argument("--batch", type=int, default=512, help="projector batch size (its default: 512)")
    asyncio.run(main(parser.parse_args()))
