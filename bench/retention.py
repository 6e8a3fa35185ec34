"""Retention benchmark: what finished jobs cost Redis, how fast the sweep
archives and removes them, and what the JOBS snapshot costs.

Starts a real nats-server (JetStream) and a real Redis, publishes ~20,000
finished jobs' lifecycles (100,000 events) to JOBS, projects them, then:

1. Redis's memory (``used_memory``) and the installation's key count;
2. a snapshot of the whole projection: its time, its size, and how long the
   script that copies it holds Redis;
3. the sweep of every job (archived to a SQLite job archive, then removed),
   timed, and Redis's memory and keys after it;
4. a snapshot of what is left, and a rebuild from it after the stream is
   trimmed and Redis flushed, timed.

    .venv/bin/python bench/retention.py [--events 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from projection_rebuild import fill

from trainyard.bus import Bus, ensure_streams
from trainyard.ledger.archive import JobArchive
from trainyard.ledger.snapshots import SnapshotStore
from trainyard.local.servers import start_nats, start_redis
from trainyard.store import Projector, Store
from trainyard.store.retention import sweep
from trainyard.store.snapshot import COPY, take

MIB = 1024 * 1024


async def footprint(store: Store) -> tuple[float, int]:
    """Redis's used memory (MiB) and the installation's keys."""
    memory = (await store.redis.info("memory"))["used_memory"] / MIB
    keys = 0
    async for _ in store.redis.scan_iter(match=store.prefix + "*", count=1000):
        keys += 1
    return memory, keys


async def project(bus: Bus, store: Store, snapshots: SnapshotStore | None = None) -> float:
    projector = Projector(bus, store, "JOBS", snapshots)
    stop = asyncio.Event()
    t0 = time.perf_counter()
    task = asyncio.create_task(projector.run(stop))
    await projector.wait_for((await bus.js.stream_info("JOBS")).state.last_seq, timeout=600)
    elapsed = time.perf_counter() - t0
    stop.set()
    await task
    return elapsed


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        nats, redis = start_nats(Path(tmp) / "nats"), start_redis(Path(tmp) / "redis")
        bus = await Bus.connect(nats.url, name="bench-retention")
        store = Store.from_url(redis.url)
        archive = JobArchive(f"sqlite:///{tmp}/ledger.db")
        snapshots = SnapshotStore(f"sqlite:///{tmp}/ledger.db")
        archive.create_schema()
        try:
            await ensure_streams(bus.js)
            head = await fill(bus, args.events)
            await project(bus, store)
            memory, keys = await footprint(store)
            print(f"{args.events // 5} finished jobs ({head} events) projected: {memory:.1f} MiB used, {keys} keys")

            t0 = time.perf_counter()
            whole = await take(store)
            assert whole is not None
            took = time.perf_counter() - t0
            copy = store.key("snapshot", "bench") + ":"
            t0 = time.perf_counter()
            copied = (await store.run_script(store.redis.register_script(COPY), [[copy, "60"]]))[0]
            held = time.perf_counter() - t0
            async for key in store.redis.scan_iter(match=copy + "*", count=1000):
                await store.redis.unlink(key)
            print(
                f"snapshot of the whole projection: {took:.2f} s, {len(whole.data) / MIB:.1f} MiB; "
                f"Redis held only while it copies the {copied} keys: {held:.2f} s"
            )

            t0 = time.perf_counter()
            forgotten = await sweep(store, archive, cutoff=4e9)
            elapsed = time.perf_counter() - t0
            memory_after, keys_after = await footprint(store)
            print(
                f"sweep: {forgotten} jobs archived and removed in {elapsed:.1f} s ({forgotten / elapsed:,.0f} jobs/s); "
                f"Redis after: {memory_after:.1f} MiB used, {keys_after} keys; archive rows: {archive.count()}"
            )

            left = await take(store)
            assert left is not None
            snapshots.put("jobs", left)
            await bus.js.purge_stream("JOBS", seq=left.seq + 1)
            await store.redis.flushall()
            rebuilt = await project(bus, store, snapshots)
            print(f"snapshot after the sweep: {len(left.data)} bytes; rebuild from it after a flush: {rebuilt:.2f} s")
        finally:
            archive.close()
            snapshots.close()
            await store.close()
            await bus.close()
            nats.stop()
            redis.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=100_000)
    asyncio.run(main(parser.parse_args()))
