"""Admission through the service: the same tenancy as bench/admission.py
(1,000 queues in 100 teams, 4 GPU types, 4,096 nodes x 8 GPUs), with the
pending jobs held in a real Redis projection fed by a real JetStream.

Times ``AdmissionCycle.run_once``: wait for caught-up projections, read the
snapshot from Redis, call ``admit``, publish every ``JobAdmitted`` with its
expected-sequence fence, and read the projection back.  Between cycles a tenth
of the admitted jobs finish.

    python bench/admission_service.py [--pending 20000] [--cycles 8] [--profile [N]] [--cold] [--window N]

Before the first cycle the bench does what the service does before it
contends for the lease, and a standby while another process leads
(``AdmissionCycle.warm``: read every pending and active job, without
deciding), and prints how long that took; ``--cold`` leaves it out, so the
first cycle reads everything itself (as a cycle does after a Redis wipe).

Each cycle's line gives its wall time and the CPU seconds of this process
(``time.process_time``: the cycle and the projectors it waits for; NATS and
Redis run in their own processes).  ``--profile`` runs every cycle under
cProfile and prints the top N functions by own time and by cumulative time.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import importlib.util
import pstats
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from trainyard.bus import Bus, PublishRequest, ensure_streams
from trainyard.core.admission import AdmissionPolicy
from trainyard.domain import JobSpec, NodeInfo, Role
from trainyard.events import JobAccepted, NodeRegistered, RunSucceeded, job_subject, subjects
from trainyard.local.servers import start_nats, start_redis
from trainyard.store import Projector, Store, views

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "services" / "admission"))
from trainyard_admission.cycle import AdmissionCycle
from trainyard_admission.tenancy import TenancyHolder

_spec = importlib.util.spec_from_file_location("core_bench", Path(__file__).with_name("admission.py"))
core_bench = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(core_bench)  # type: ignore[union-attr]


async def publish_all(bus: Bus, requests: list[PublishRequest], chunk: int = 2000) -> None:
    for i in range(0, len(requests), chunk):
        for r in await bus.publish_many(requests[i : i + chunk]):
            if isinstance(r, Exception):
                raise r


async def main(pending: int, cycles: int, profile: int = 0, cold: bool = False, window: int | None = None) -> None:
    tenancy, _ = core_bench.build_tenancy()
    rng = random.Random(7)
    with tempfile.TemporaryDirectory(prefix="trainyard-bench-") as tmp:
        nats, redis = start_nats(Path(tmp) / "nats"), start_redis(Path(tmp) / "redis")
        bus = await Bus.connect(nats.url, "bench")
        await ensure_streams(bus.js)
        store = Store.from_url(redis.url)
        try:
            t0 = time.perf_counter()
            nodes = [
                NodeInfo(node_id=f"n{i:04d}", cluster="bench", gpu_type=core_bench.FLAVORS[i % 4], gpus=8)
                for i in range(core_bench.NODES)
            ]
            await publish_all(
                bus,
                [
                    PublishRequest(
                        subjects.node("bench", n.node_id), NodeRegistered(at=0.0, node=n, boot_id="b"), n.node_id
                    )
                    for n in nodes
                ],
            )
            queues = tenancy.queues
            accepted = []
            for i in range(pending):
                q = queues[rng.randrange(len(queues))]
                gpu_type = rng.choice(sorted(q.quota))
                spec = JobSpec(
                    tenant=q.tenant,
                    queue=q.name,
                    roles=[
                        Role(
                            name="t",
                            gpus_per_replica=min(8, s := rng.choice(core_bench.SIZES)),
                            replicas=max(1, s // 8),
                            gpu_type=gpu_type,
                        )
                    ],
                    simulated_duration_s=60.0,
                )
                event = JobAccepted(at=float(i), job_id=f"j{i}", spec=spec, submitted_at=float(i))
                accepted.append(PublishRequest(job_subject(event), event, f"j{i}:accepted", 0))
            await publish_all(bus, accepted)
            jobs, node_proj = Projector(bus, store, "JOBS"), Projector(bus, store, "NODES")
            stop = asyncio.Event()
            tasks = [asyncio.create_task(jobs.run(stop)), asyncio.create_task(node_proj.run(stop))]
            await jobs.caught_up(timeout=600)
            await node_proj.caught_up(timeout=600)
            print(f"seeded {pending:,} pending jobs and {len(nodes):,} nodes in {time.perf_counter() - t0:.1f}s")

            holder = TenancyHolder()
            holder.set(tenancy)
            cycle = AdmissionCycle(
                bus,
                store,
                jobs,
                AdmissionPolicy(),
                time.time,
                window=window or pending,
                node_projector=(node_proj,),
                tenancy=holder,
                placement_timeout_s=1e9,
            )
            if not cold:
                start, start_cpu = time.perf_counter(), time.process_time()
                await cycle.warm()
                print(
                    f"standby read of the backlog (before the first cycle): {(time.perf_counter() - start) * 1000:.0f} ms, "
                    f"CPU {(time.process_time() - start_cpu) * 1000:.0f} ms",
                    flush=True,
                )
            times, cpu, considered, admitted_total = [], [], [], 0
            profiler = cProfile.Profile() if profile else None
            for c in range(cycles):
                await jobs.caught_up(timeout=600)  # time the cycle, not the finishing jobs' events
                waiting = len(await views.ids_in(store, "pending"))
                active = len(await views.ids_in(store, "active"))
                if profiler is not None:
                    profiler.enable()
                start, start_cpu = time.perf_counter(), time.process_time()
                admitted = await cycle.run_once()
                times.append(time.perf_counter() - start)
                cpu.append(time.process_time() - start_cpu)
                if profiler is not None:
                    profiler.disable()
                considered.append(waiting + active)
                admitted_total += admitted
                print(
                    f"cycle {c}: {waiting:,} pending + {active:,} holding GPUs, {admitted:,} decisions published, "
                    f"{times[-1] * 1000:.0f} ms, CPU {cpu[-1] * 1000:.0f} ms ({', '.join(f'{k} {v * 1000:.0f}' for k, v in cycle.last_timings.items())})",
                    flush=True,
                )
                finished = [j for j in await views.ids_in(store, "active")][: max(1, active // 10)]
                heads = await views.get_jobs(store, finished, ("run_id",))
                await publish_all(
                    bus,
                    [
                        PublishRequest(
                            subjects.job(h.tenant, h.job_id, "agent"),
                            RunSucceeded(at=time.time(), job_id=h.job_id, tenant=h.tenant, run_id=h.run_id or ""),
                            f"{h.run_id}:succeeded",
                        )
                        for h in heads
                        if h.run_id
                    ],
                )
            ordered = sorted(times)
            p50 = statistics.median(ordered)
            p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
            rate = sum(considered) / sum(times)
            print(
                f"\nthrough the service: {rate:,.0f} decisions/s (every pending and running job weighed each cycle); "
                f"cycle p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms; {admitted_total:,} admissions published"
            )
            print(
                f"{'cold' if cold else 'first'} cycle {times[0] * 1000:.0f} ms (CPU {cpu[0] * 1000:.0f} ms); later cycles: wall max "
                f"{max(times[1:], default=0) * 1000:.0f} ms, CPU p50 {statistics.median(cpu[1:] or [0]) * 1000:.0f} ms, "
                f"CPU max {max(cpu[1:], default=0) * 1000:.0f} ms"
            )
            if profiler is not None:
                stats = pstats.Stats(profiler)
                stats.sort_stats("tottime").print_stats(profile)
                stats.sort_stats("cumulative").print_stats(profile)
            stop.set()
            await asyncio.gather(*tasks)
        finally:
            await bus.close()
            await store.close()
            nats.stop()
            redis.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pending", type=int, default=20_000)
    parser.add_argument("--cycles", type=int, default=8)
    parser.add_argument(
        "--profile",
        type=int,
        nargs="?",
        const=30,
        default=0,
        help="profile the cycles and print the top N functions (default 30)",
    )
    parser.add_argument(
        "--cold", action="store_true", help="no standby read before the first cycle: it reads every job itself"
    )
    parser.add_argument(
        "--window",
        type=int,
        default=None,
        help="pending jobs one cycle considers (default: every pending job; the service's own default is 20,000)",
    )
    args = parser.parse_args()
    if args.window is not None and args.window < 1:
        parser.error("--window must be at least 1")
    asyncio.run(main(args.pending, args.cycles, args.profile, args.cold, args.window))
