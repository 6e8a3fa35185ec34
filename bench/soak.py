"""Soak: a deep queue and a steady stream for a long time, with every
process's memory sampled, to show that nothing grows without bound.

    .venv/bin/python bench/soak.py                                  # 100,000 queued, 10 minutes at 20 jobs/s
    .venv/bin/python bench/soak.py --queued 20000 --minutes 5 --rate 20

It starts a whole local stack with a tenancy that gives tenant ``deep`` half
the GPUs and tenant ``stream`` the other half (neither may borrow), submits
``--queued`` hour-long 8-GPU jobs for ``deep`` (a few run, the rest wait on
quota), then offers 1-second 1-GPU jobs for ``stream`` at ``--rate`` per second
for ``--minutes``, which run on the other half, while sampling the resident memory (RSS) of every process every
``--sample-s`` seconds.  It prints, per process, the RSS after the queue was
submitted, at the end, and the least-squares slope over the second half of
the stream in MiB per minute (flat memory: a slope near zero).  ``--json``
prints the samples as well.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time

import msgspec

from trainyard.bus import Bus
from trainyard.config.store import ConfigStore
from trainyard.domain import JobSpec, Role
from trainyard.local import LocalStack, StackConfig
from trainyard.store import Store, views
from trainyard.testing.chaos import submit_event
from trainyard.testing.procs import rss_mib


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (minutes, MiB)."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    return 0.0 if var == 0 else sum((x - mx) * (y - my) for x, y in points) / var


def pids(stack: LocalStack) -> dict[str, int]:
    out = {name: proc.pid for name, proc in stack.procs.items()}
    if stack.nats:
        out["nats-server"] = stack.nats.proc.pid
    if stack.redis:
        out["redis-server"] = stack.redis.proc.pid
    return out


def tenancy(gpus: int) -> str:
    half = gpus // 2
    return f"""
flavors: [{{name: H100, node_pool: emulated, gpus_per_node: 8}}]
priority_classes: [{{name: standard, priority: 500}}]
organisations:
  - name: soak
    quota: {{H100: {{nominal: {gpus}}}}}
    teams:
      - name: deep
        quota: {{H100: {{nominal: {half}, borrowing_limit: 0}}}}
        queues: [{{name: default, quota: {{H100: {{nominal: {half}, borrowing_limit: 0}}}}}}]
      - name: stream
        quota: {{H100: {{nominal: {half}, borrowing_limit: 0}}}}
        queues: [{{name: default, quota: {{H100: {{nominal: {half}, borrowing_limit: 0}}}}}}]
"""


def spec(tenant: str, gpus: int, seconds: float) -> JobSpec:
    return JobSpec(
        tenant=tenant,
        queue="default",
        roles=[Role(name="trainer", gpus_per_replica=gpus)],
        simulated_duration_s=seconds,
    )


async def submit_many(bus: Bus, jobs: list[tuple[str, JobSpec]], concurrency: int = 64) -> None:
    sem = asyncio.Semaphore(concurrency)

    async def one(job_id: str, s: JobSpec) -> None:
        async with sem:
            await submit_event(bus, job_id, s)

    await asyncio.gather(*(one(j, s) for j, s in jobs))


async def main(args: argparse.Namespace) -> int:
    with contextlib.ExitStack() as cleanup:
        tmp = args.keep or cleanup.enter_context(tempfile.TemporaryDirectory(prefix="trainyard-soak-"))
        stack = LocalStack(StackConfig(data_dir=tmp, nodes=args.nodes, racks=4, log_level="WARNING"))
        await asyncio.to_thread(stack.start)
        assert stack.nats and stack.redis
        bus = await Bus.connect(stack.nats.admin_url, "soak")
        store = Store.from_url(stack.redis.admin_url)
        samples: dict[str, list[tuple[float, float]]] = {}
        try:
            t0 = time.monotonic()
            config = await ConfigStore.open(bus)
            await config.apply(tenancy(args.nodes * 8), actor="bench:soak", reason="half deep queue, half stream")
            # The deep queue: 8-GPU jobs of an hour; its half of the cluster holds only a few at a time.
            queued = [(f"soak-q-{i:06d}", spec("deep", 8, 3600.0)) for i in range(args.queued)]
            await submit_many(bus, queued)
            print(f"{args.queued} jobs queued in {time.monotonic() - t0:.0f}s", file=sys.stderr)
            while (await views.status_counts(store)).get("pending", 0) < args.queued * 0.9:
                await asyncio.sleep(1.0)
            print(f"accepted: {await views.status_counts(store)}", file=sys.stderr)

            start = time.monotonic()
            end = start + args.minutes * 60
            next_sample, i = start, 0
            while time.monotonic() < end:
                now = time.monotonic()
                if now >= next_sample:
                    for name, pid in pids(stack).items():
                        mib = rss_mib(pid)
                        if mib is not None:
                            samples.setdefault(name, []).append(((now - start) / 60, mib))
                    next_sample += args.sample_s
                # The steady stream: short 1-GPU jobs, which backfill around the queue.
                await submit_event(bus, f"soak-s-{i:07d}", spec("stream", 1, 1.0))
                i += 1
                await asyncio.sleep(max(0.0, start + i / args.rate - time.monotonic()))
            counts = await views.status_counts(store)
        finally:
            await bus.close()
            await store.close()
            await asyncio.to_thread(stack.stop)
    half = args.minutes / 2
    report = {
        name: {
            "start_mib": round(points[0][1], 1),
            "end_mib": round(points[-1][1], 1),
            "max_mib": round(max(y for _, y in points), 1),
            "slope_second_half_mib_per_min": round(slope([p for p in points if p[0] >= half]), 3),
        }
        for name, points in sorted(samples.items())
    }
    if args.json:
        print(
            msgspec.json.format(
                msgspec.json.encode({"report": report, "statuses": counts, "samples": samples})
            ).decode()
        )
    else:
        print(f"{'process':>14}  {'start MiB':>9}  {'end MiB':>8}  {'max MiB':>8}  {'slope 2nd half MiB/min':>22}")
        for name, r in report.items():
            print(
                f"{name:>14}  {r['start_mib']:>9}  {r['end_mib']:>8}  {r['max_mib']:>8}  "
                f"{r['slope_second_half_mib_per_min']:>22}"
            )
        print(f"statuses at the end: {counts}; streamed {i} jobs in {args.minutes} min")
    return 0


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--queued", type=int, default=100_000)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--rate", type=float, default=20.0, help="streamed jobs per second")
    p.add_argument("--nodes", type=int, default=32)
    p.add_argument("--sample-s", type=float, default=15.0)
    p.add_argument("--keep", metavar="DIR", help="run the stack in DIR and keep it afterwards")
    p.add_argument("--json", action="store_true")
    return p.parse_args()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse())))
