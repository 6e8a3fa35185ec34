"""What fsync costs: acknowledged JetStream publishes with nats-server's
default ``sync_interval`` (fsync every 2 minutes) and with ``always`` (fsync
before each acknowledgement), on one node and on a 3-node cluster with R3
streams.

Each case starts fresh servers under a temporary directory (``--dir`` puts it
on the disk to measure: the default temporary directory may be a RAM disk),
creates the streams, and publishes ``--messages`` job events of about 300
bytes to JOBS with ``--inflight`` publishes waiting at once, each with its
own ``Nats-Msg-Id``, as the services do.  It prints acknowledged messages per
second and the p50 / p99 publish latency (send to acknowledgement).

    .venv/bin/python bench/nats_sync.py [--messages 5000] [--inflight 1 32] [--dir PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from trainyard.bus import Bus, ensure_streams
from trainyard.events import JobCancelled, encode, job_subject
from trainyard.local.servers import start_nats, start_nats_cluster

CASES = [  # (nodes, sync_interval)
    (1, "default"),
    (1, "always"),
    (3, "default"),
    (3, "always"),
]


@contextmanager
def servers(directory: Path, nodes: int, sync: str) -> Iterator[str]:
    if nodes == 1:
        server = start_nats(directory / "nats", sync_interval=sync)
        try:
            yield server.url
        finally:
            server.stop()
        return
    cluster = start_nats_cluster(directory / "cluster", nodes, sync_interval=sync)
    try:
        yield cluster.url
    finally:
        cluster.stop()


async def publish(url: str, replicas: int, messages: int, inflight: int) -> tuple[float, list[float]]:
    """Seconds for ``messages`` acknowledged publishes, and each one's latency."""
    bus = await Bus.connect(url, "bench-nats-sync")
    try:
        await ensure_streams(bus.js, replicas=replicas)
        latencies: list[float] = []
        queue: asyncio.Queue[int] = asyncio.Queue()
        for n in range(messages):
            queue.put_nowait(n)

        async def worker() -> None:
            while not queue.empty():
                n = queue.get_nowait()
                event = JobCancelled(
                    at=time.time(),
                    job_id=f"job-{n:08d}",
                    tenant="acme",
                    reason="a cancellation of about the size of a lifecycle event " * 3,
                )
                started = time.perf_counter()
                await bus.publish_raw(job_subject(event), encode(event), {"Nats-Msg-Id": f"bench:{n}"})
                latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(inflight)))
        return time.perf_counter() - started, latencies
    finally:
        await bus.close()


def percentile(values: list[float], p: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(p) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--inflight", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--dir", type=Path, default=None, help="where the servers keep their data")
    args = parser.parse_args()
    print(f"{args.messages} acknowledged publishes per case, ~300-byte job events to JOBS")
    print(
        f"{'nodes':>5} {'replicas':>8} {'sync_interval':>13} {'in flight':>9} {'msgs/s':>9} {'p50 ms':>8} {'p99 ms':>8}"
    )
    for nodes, sync in CASES:
        for inflight in args.inflight:
            with tempfile.TemporaryDirectory(dir=args.dir) as tmp, servers(Path(tmp), nodes, sync) as url:
                replicas = 1 if nodes == 1 else 3
                seconds, latencies = asyncio.run(publish(url, replicas, args.messages, inflight))
            print(
                f"{nodes:>5} {replicas:>8} {sync:>13} {inflight:>9} {args.messages / seconds:>9,.0f} "
                f"{percentile(latencies, 50) * 1e3:>8.2f} {percentile(latencies, 99) * 1e3:>8.2f}"
            )


if __name__ == "__main__":
    main()
