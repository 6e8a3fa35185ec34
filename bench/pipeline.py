"""Submit-to-placed throughput and latency of the whole local stack.

Starts the stack (real nats-server and Redis, every service in its own
process, an emulated cluster), offers SubmitJob events on the intake subject
at a fixed rate, and follows the JOBS stream for JobPlaced.  Prints, per
offered rate, the sustained placed jobs/s and the p50/p99 submit-to-placed
latency.

    python bench/pipeline.py                       # 250, 500, 1000 jobs/s for 10 s each
    python bench/pipeline.py --rates 500 --seconds 20
    python bench/pipeline.py --rates 100 --seconds 30  # CPU per job at a steady 100 jobs/s
    python bench/pipeline.py --nats-cluster 3          # a 3-node NATS cluster, R3 streams

It runs the stack's defaults (one NATS node that fsyncs before it
acknowledges, group commit on) unless told otherwise, and prints the
durability it measured first.

After the rates it prints each process's CPU milliseconds per placed job at
each rate (user + system, from /proc, over the rate's window).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from nats.js.api import ConsumerConfig, DeliverPolicy

from trainyard.bus import Bus
from trainyard.domain import JobSpec, Role
from trainyard.events import JobPlaced, SubmitJob, decode_job_event, encode, subjects
from trainyard.local import LocalStack, StackConfig
from trainyard.settings import load_settings


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def offer(bus: Bus, rate: int, seconds: float, tag: str, sent: dict[str, float]) -> None:
    """Publish ``rate`` submissions per second, in 10 ms slices, pipelined."""
    total = int(rate * seconds)
    spec = JobSpec(
        tenant="bench", queue="default", roles=[Role(name="worker", gpus_per_replica=1)], simulated_duration_s=0.5
    )
    start = time.perf_counter()
    subject = subjects.intake("bench")
    for i in range(total):
        due = start + i / rate
        delay = due - time.perf_counter()
        if delay > 0.005:
            await asyncio.sleep(delay)
        job_id = f"{tag}-{i}"
        sent[job_id] = time.time()
        await bus.nc.publish(
            subject,
            encode(SubmitJob(at=sent[job_id], spec=spec, job_id=job_id)),
            headers={"Nats-Msg-Id": f"bench:{job_id}"},
        )
    await bus.nc.flush()


async def measure(stack: LocalStack, rate: int, seconds: float) -> dict[str, float]:
    assert stack.nats
    bus = await Bus.connect(stack.nats.admin_url, "bench")
    sent: dict[str, float] = {}
    placed: dict[str, float] = {}
    tag = f"r{rate}t{int(time.time())}"
    total = int(rate * seconds)
    done = asyncio.Event()

    async def on_msg(msg) -> None:  # type: ignore[no-untyped-def]
        event = decode_job_event(msg.data)
        if isinstance(event, JobPlaced) and event.job_id.startswith(tag + "-"):
            placed.setdefault(event.job_id, time.time())
            if len(placed) >= total:
                done.set()

    sub = await bus.js.subscribe(
        subjects.JOBS_ALL,
        stream="JOBS",
        ordered_consumer=True,
        cb=on_msg,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.NEW),
    )
    t0 = time.time()
    await offer(bus, rate, seconds, tag, sent)
    offered_for = time.time() - t0
    try:
        await asyncio.wait_for(done.wait(), timeout=max(60.0, seconds * 4))
    except TimeoutError:
        pass
    await sub.unsubscribe()
    await bus.close()
    latencies = [placed[j] - sent[j] for j in placed]
    span = (max(placed.values()) - t0) if placed else float("nan")
    return {
        "offered_per_s": rate,
        "offered_actual_per_s": total / offered_for,
        "jobs": total,
        "placed": len(placed),
        "placed_per_s": len(placed) / span if placed else 0.0,
        "p50_ms": percentile(latencies, 0.50) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
        "mean_ms": statistics.fmean(latencies) * 1000 if latencies else float("nan"),
    }


def cpu_seconds(stack: LocalStack) -> dict[str, float]:
    """User+system CPU time of each process of the stack, from /proc."""
    import os

    ticks = os.sysconf("SC_CLK_TCK")
    procs = {**{n: p.pid for n, p in stack.procs.items()}}
    if stack.nats and stack.redis:
        procs |= {"nats-server": stack.nats.proc.pid, "redis": stack.redis.proc.pid}
    out = {}
    for name, pid in procs.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            out[name] = (int(fields[11]) + int(fields[12])) / ticks
        except OSError:
            out[name] = float("nan")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", type=int, nargs="+", default=[250, 500, 1000])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--nodes", type=int, default=128, help="emulated 8-GPU nodes (default 1,024 GPUs)")
    parser.add_argument("--nats-sync", default="", help="always, default or a duration (default: the stack's)")
    parser.add_argument("--nats-cluster", type=int, default=1, help="NATS nodes: 1, or 3 (a cluster, R3 streams)")
    args = parser.parse_args()
    group_commit = load_settings().nats_group_commit
    with tempfile.TemporaryDirectory(prefix="trainyard-bench-") as tmp:
        config = StackConfig(
            data_dir=tmp,
            nodes=args.nodes,
            racks=max(1, args.nodes // 16),
            log_level="WARNING",
            heartbeat_interval_s=2.0,
            heartbeat_timeout_s=30.0,
            nats_sync=args.nats_sync,
            nats_cluster=args.nats_cluster,
        )
        stack = LocalStack(config)
        stack.start()
        print(
            f"durability: {args.nats_cluster} NATS node(s), R{stack.nats_replicas} streams, "
            f"sync_interval {stack.nats_sync} ({'fsync before each acknowledgement' if stack.nats_sync == 'always' else 'fsync every interval'}), "
            f"group commit {'on' if group_commit else 'off (TRAINYARD_NATS_GROUP_COMMIT)'}"
        )
        try:
            time.sleep(3.0)  # nodes register, leaders take their leases
            print(f"cluster: {args.nodes} nodes x 8 GPUs; jobs: 1 GPU, 0.5 s each; {args.seconds:.0f} s per rate")
            print(f"{'offered/s':>10} {'placed':>8} {'placed/s':>9} {'p50 ms':>8} {'p99 ms':>8}")
            per_job = []
            for rate in args.rates:
                before = cpu_seconds(stack)
                r = asyncio.run(measure(stack, rate, args.seconds))
                after = cpu_seconds(stack)
                spent = {n: after[n] - v for n, v in before.items()}
                per_job.append((rate, {n: 1000 * v / max(r["placed"], 1) for n, v in spent.items()}))
                print(
                    f"{r['offered_actual_per_s']:>10.0f} {r['placed']:>8.0f} {r['placed_per_s']:>9.0f} "
                    f"{r['p50_ms']:>8.0f} {r['p99_ms']:>8.0f}",
                    flush=True,
                )
                time.sleep(2.0)
            print("\nCPU milliseconds per placed job, per process (from submission until the run's end was metered):")
            names = list(per_job[0][1]) if per_job else []
            print(f"{'offered/s':>10} " + " ".join(f"{n:>11}" for n in names) + "  admission+placement")
            for rate, ms in per_job:
                both = ms.get("admission", 0.0) + ms.get("placement", 0.0)
                print(f"{rate:>10} " + " ".join(f"{ms[n]:>11.2f}" for n in names) + f"  {both:>19.2f}")
            print("CPU seconds per process over the run:", {n: round(v, 1) for n, v in cpu_seconds(stack).items()})
        finally:
            if stack.exited():
                print(f"processes that exited: {stack.exited()}", file=sys.stderr)
            stack.stop()


if __name__ == "__main__":
    main()
