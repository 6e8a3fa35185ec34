"""A year in a day: finished jobs pushed through JOBS as fast as the machine
takes them, with retention, the JOBS snapshot and the stream's age limit in
force on an accelerated clock, while Redis's memory, the JOBS stream and
every process's memory are sampled, to show that they stay flat.

    .venv/bin/python bench/year_soak.py --jobs 1000000 --minutes 30
    .venv/bin/python bench/year_soak.py --jobs 200 --sample-s 1           # a smoke run

It starts a real local stack with only the service that owns the JOBS
projection, its retention sweep, the job archive and the snapshot
(admission), with seconds where an installation has days:
``TRAINYARD_JOB_RETENTION_S`` (``--retention-s``, 7 days in production),
``TRAINYARD_RETENTION_SWEEP_INTERVAL_S`` (``--sweep-s``) and
``TRAINYARD_JOBS_SNAPSHOT_INTERVAL_S`` (``--snapshot-s``, an hour); once the
service has declared its streams, JOBS's age limit (90 days) is set to
``--stream-age-s``.  It then publishes whole job lifecycles (accepted,
admitted, placed, run started, run succeeded: the events the services
publish, stamped with the time they are sent) onto JOBS through the bus's
batched publishes, ``--batch`` jobs at a time, until ``--jobs`` jobs or
``--minutes`` minutes, sampling every ``--sample-s`` seconds: Redis's
``used_memory``, the JOBS stream's bytes and messages, every process's
resident memory, the ledger database's size (the job archive grows by
design: it keeps every job) and the jobs in the projection.  It prints the
samples, the least-squares slope of each curve over the second half of the
run, then FLUSHALLs Redis and times the rebuild (the newest snapshot, then
the stream after it) until the projection holds the stream's head again.
``--json`` prints the report as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import msgspec
from nats.js.errors import NotFoundError
from projection_rebuild import lifecycle
from soak import pids, slope

from trainyard.bus import Bus
from trainyard.bus.streams import STREAMS, stream_config
from trainyard.local import LocalStack, StackConfig
from trainyard.store import Store
from trainyard.store.projector import wait_until_projected
from trainyard.testing.procs import rss_mib

MIB = 1024 * 1024
EVENTS_PER_JOB = 5


def second_half_slopes(samples: list[dict[str, float]]) -> dict[str, float]:
    """Each curve's least-squares slope per minute over the second half of the run."""
    if not samples:
        return {}
    half = samples[-1]["minute"] / 2
    late = [s for s in samples if s["minute"] >= half]
    names = [k for k in samples[0] if k not in ("minute", "published")]
    return {name: slope([(s["minute"], s[name]) for s in late if name in s]) for name in names}


def file_mib(path: Path) -> float:
    """The size of an SQLite database with its write-ahead log, in MiB."""
    return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists()) / MIB


async def sample(stack: LocalStack, bus: Bus, store: Store, minute: float, published: int) -> dict[str, float]:
    info = (await bus.js.stream_info("JOBS")).state
    row: dict[str, float] = {
        "minute": minute,
        "published": published,
        "redis_used_mib": (await store.redis.info("memory"))["used_memory"] / MIB,
        "jobs_stream_mib": info.bytes / MIB,
        "jobs_stream_msgs": info.messages,
        "projection_jobs": await store.redis.zcard(store.key("jobs")),
        "projection_lag_events": info.last_seq - await projected(store),
        "ledger_db_mib": file_mib(stack.data_dir / "ledger.db"),
    }
    for name, pid in pids(stack).items():
        if (mib := rss_mib(pid)) is not None:
            row[f"rss_{name}_mib"] = mib
    if (mib := rss_mib(os.getpid())) is not None:
        row["rss_publisher_mib"] = mib
    return row


async def until(check, what: str, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not within {timeout:g} s")
        await asyncio.sleep(0.2)


async def admission_ready(bus: Bus) -> bool:
    try:
        await bus.js.consumer_info("INTAKE", "admission-intake")
    except NotFoundError:
        return False
    return True


async def shorten_jobs_stream(bus: Bus, max_age_s: float) -> None:
    """JOBS with its age limit on the accelerated clock (the service declared it with 90 days)."""
    (jobs,) = [s for s in STREAMS if s.name == "JOBS"]
    window = min(jobs.duplicate_window_s, max_age_s)  # NATS wants the duplicate window within the age
    await bus.js.update_stream(
        stream_config(msgspec.structs.replace(jobs, max_age_s=max_age_s, duplicate_window_s=window))
    )


async def projected(store: Store) -> int:
    """The JOBS sequence the projection holds everything through."""
    return int(await store.redis.hget(store.key("proj", "jobs"), "last_seq") or 0)


async def publish(bus: Bus, store: Store, args: argparse.Namespace, stop: asyncio.Event, sent: list[int]) -> None:
    """Publish lifecycles, ``--batch`` jobs a call, ``--concurrency`` calls at
    once, holding back while the projection is more than ``--max-lag`` events
    behind (a projector that falls behind by more than retention folds only
    jobs already due to leave, and one behind the stream's age loses events)."""
    next_job, head = 0, 0

    async def worker() -> None:
        nonlocal next_job, head
        while next_job < args.jobs and not stop.is_set():
            if head - await projected(store) > args.max_lag:
                await asyncio.sleep(0.05)
                continue
            first = next_job
            last = next_job = min(args.jobs, first + args.batch)
            now = time.time()
            requests = [r for j in range(first, last) for r in lifecycle(j, now - 3.0, run_s=3.0)]
            for result in await bus.publish_many(requests):
                if isinstance(result, Exception):
                    raise result
                head = max(head, result.seq)
            sent[0] += last - first

    await asyncio.gather(*(worker() for _ in range(args.concurrency)))


async def run(args: argparse.Namespace, data_dir: str) -> dict[str, object]:
    os.environ.update(
        TRAINYARD_JOB_RETENTION_S=str(args.retention_s),
        TRAINYARD_RETENTION_SWEEP_INTERVAL_S=str(args.sweep_s),
        TRAINYARD_JOBS_SNAPSHOT_INTERVAL_S=str(args.snapshot_s),
    )
    stack = LocalStack(StackConfig(data_dir=data_dir, nodes=0, log_level="WARNING"))
    await asyncio.to_thread(stack.start, ["admission"])
    assert stack.nats and stack.redis
    bus = await Bus.connect(stack.nats.admin_url, "year-soak")
    store = Store.from_url(stack.redis.admin_url)
    samples: list[dict[str, float]] = []
    sent = [0]
    try:
        await until(lambda: admission_ready(bus), "admission declaring its streams and consumer")
        await shorten_jobs_stream(bus, args.stream_age_s)
        start = time.monotonic()
        stop = asyncio.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):  # stop publishing early, and report
            asyncio.get_running_loop().add_signal_handler(signum, stop.set)
        asyncio.get_running_loop().call_later(args.minutes * 60, stop.set)
        publisher = asyncio.create_task(publish(bus, store, args, stop, sent))
        while True:
            samples.append(await sample(stack, bus, store, (time.monotonic() - start) / 60, sent[0]))
            print(_row(samples[-1]), file=sys.stderr, flush=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(publisher), args.sample_s)
            if publisher.done():
                break
        await publisher
        elapsed = time.monotonic() - start
        head = (await bus.js.stream_info("JOBS")).state.last_seq
        await wait_until_projected(bus, store, "JOBS", seq=head, timeout=600)
        samples.append(await sample(stack, bus, store, (time.monotonic() - start) / 60, sent[0]))
        kept = await store.redis.zcard(store.key("jobs"))
        t0 = time.monotonic()
        await store.redis.flushall()
        await wait_until_projected(bus, store, "JOBS", seq=head, timeout=600)
        rebuild_s = time.monotonic() - t0
        rebuilt = await store.redis.zcard(store.key("jobs"))
    finally:
        await bus.close()
        await store.close()
        await asyncio.to_thread(stack.stop)
    return {
        "settings": {k: v for k, v in vars(args).items() if k not in ("json", "keep")},
        "jobs_published": sent[0],
        "events_published": sent[0] * EVENTS_PER_JOB,
        "elapsed_s": round(elapsed, 1),
        "jobs_per_s": round(sent[0] / elapsed, 1),
        "slopes_per_min_second_half": {k: round(v, 4) for k, v in second_half_slopes(samples).items()},
        "rebuild": {"head_seq": head, "jobs_before": kept, "jobs_after": rebuilt, "seconds": round(rebuild_s, 2)},
        "samples": samples,
    }


def _row(s: dict[str, float]) -> str:
    rss = " ".join(f"{k[4:-4]}={v:.0f}" for k, v in s.items() if k.startswith("rss_"))
    return (
        f"{s['minute']:6.1f} min {int(s['published']):>10,} jobs | redis {s['redis_used_mib']:6.1f} MiB | "
        f"JOBS {s['jobs_stream_mib']:7.1f} MiB {int(s['jobs_stream_msgs']):>8,} msgs | "
        f"projection {int(s['projection_jobs']):>7,} lag {int(s['projection_lag_events']):>7,} | ledger {s['ledger_db_mib']:7.1f} MiB | RSS MiB {rss}"
    )


def print_report(report: dict[str, object]) -> None:
    for s in report["samples"]:  # type: ignore[attr-defined]
        print(_row(s))
    print(
        f"{report['jobs_published']:,} jobs ({report['events_published']:,} events) in {report['elapsed_s']} s: "
        f"{report['jobs_per_s']} jobs/s"
    )
    print("least-squares slope over the second half, per minute:")
    for name, value in report["slopes_per_min_second_half"].items():  # type: ignore[attr-defined]
        print(f"  {name:>28}  {value:+.3f}")
    r = report["rebuild"]
    print(
        f"FLUSHALL at sequence {r['head_seq']:,} ({r['jobs_before']:,} jobs in the projection): "  # type: ignore[index]
        f"whole again in {r['seconds']} s with {r['jobs_after']:,} jobs"  # type: ignore[index]
    )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=10_000_000, help="jobs to publish at most")
    p.add_argument("--minutes", type=float, default=30.0, help="stop publishing after this long at most")
    p.add_argument("--retention-s", type=float, default=30.0, help="a finished job's time in Redis (7 days)")
    p.add_argument("--sweep-s", type=float, default=5.0, help="retention sweep interval (60 s)")
    p.add_argument("--snapshot-s", type=float, default=30.0, help="JOBS snapshot interval (an hour)")
    p.add_argument("--stream-age-s", type=float, default=120.0, help="JOBS stream's age limit (90 days)")
    p.add_argument("--batch", type=int, default=200, help="jobs per batched publish")
    p.add_argument("--concurrency", type=int, default=2, help="batched publishes in flight")
    p.add_argument("--max-lag", type=int, default=10_000, help="JOBS events the projection may be behind")
    p.add_argument("--sample-s", type=float, default=10.0)
    p.add_argument("--keep", metavar="DIR", help="run the stack in DIR and keep it afterwards")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    for name in ("jobs", "batch", "concurrency", "max_lag"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    for name in ("minutes", "retention_s", "sweep_s", "snapshot_s", "stream_age_s", "sample_s"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be above 0, got {getattr(args, name)}")
    return args


def main() -> int:
    args = parse()
    with contextlib.ExitStack() as cleanup:
        data_dir = args.keep or cleanup.enter_context(tempfile.TemporaryDirectory(prefix="trainyard-year-"))
        report = asyncio.run(run(args, data_dir))
    if args.json:
        print(msgspec.json.format(msgspec.json.encode(report)).decode())
    else:
        print_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
