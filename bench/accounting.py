"""Benchmark the accounting ledger: ingest lifecycle events, then export a month.

    python bench/accounting.py [--events N] [--batch B] [--seed S] [--keep]

Generates N synthetic job lifecycle events (seeded: the same arguments give
the same events), delivered as JetStream would deliver them to a busy
consumer: slightly out of order, with about 1% redelivered under the same
stream sequence and 0.5% published twice under a new one.  They are applied
in batches of B to a SQLite ledger in a temporary directory, and November
2026 is exported as CSV and as Parquet.  Prints events/s and export times.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "libs"))

from trainyard.core.accounting import load_rate_card
from trainyard.domain.job import JobSpec, Role
from trainyard.events.jobs import (
    JobAccepted,
    JobAdmitted,
    JobCancelled,
    JobEvent,
    JobPlaced,
    ReplicaPlacement,
    RunFailed,
    RunStarted,
    RunSucceeded,
)
from trainyard.ledger import chargeback
from trainyard_accounting.writer import LedgerWriter

OCT15 = 1_792_022_400.0  # 2026-10-15T00:00:00Z
DEC1 = 1_796_083_200.0  # 2026-12-01T00:00:00Z
SPAN = 45 * 86_400.0  # jobs are submitted from mid-October to the end of November
TENANTS = [f"tenant-{i:02d}" for i in range(20)]
GPU_TYPES = ["H100", "H200", "A100", "L40S"]
RATE_CARD = load_rate_card(
    {
        "currency": "USD",
        "versions": [
            {
                "version": "2026-10",
                "effective_from": "2026-10-01",
                "prices": {"H100": "2.49", "H200": "3.19", "*": "1.10"},
            },
            {
                "version": "2026-11-15",
                "effective_from": "2026-11-15",
                "prices": {"H100": "2.29", "H200": "2.99", "*": "0.99"},
            },
        ],
    }
)


def job_events(rng: random.Random, n: int) -> list[JobEvent]:
    """One job's events: accepted, then one to three runs until one ends for good."""
    tenant = rng.choice(TENANTS)
    job_id = f"job-{n:07d}"
    gpus_per_replica = rng.choice([1, 2, 4, 8, 8, 8])
    replicas = rng.choice([1, 1, 2, 4, 8, 16]) if gpus_per_replica == 8 else 1
    role = Role(name="trainer", replicas=replicas, gpus_per_replica=gpus_per_replica, gpu_type=rng.choice(GPU_TYPES))
    spec = JobSpec(
        tenant=tenant,
        queue=f"q{rng.randrange(4)}",
        roles=[role],
        labels={"team": f"team-{rng.randrange(8)}"},
        image="img",
    )
    at = OCT15 + rng.random() * SPAN
    events: list[JobEvent] = [JobAccepted(at=at, job_id=job_id, spec=spec, submitted_at=at)]
    for attempt in range(1, 4):
        run_id = f"{job_id}-r{attempt}"
        at += rng.expovariate(1 / 600)
        events.append(JobAdmitted(at=at, job_id=job_id, tenant=tenant, run_id=run_id, attempt=attempt))
        at += rng.random() * 30
        placement = [
            ReplicaPlacement(
                role="trainer",
                replica=i,
                rank=i,
                node_id=f"node-{rng.randrange(4096)}",
                gpus=list(range(gpus_per_replica)),
            )
            for i in range(replicas)
        ]
        events.append(JobPlaced(at=at, job_id=job_id, tenant=tenant, run_id=run_id, cluster="c1", replicas=placement))
        at += rng.random() * 120
        events.append(RunStarted(at=at, job_id=job_id, tenant=tenant, run_id=run_id))
        at += rng.expovariate(1 / 14_400)
        roll = rng.random()
        if roll < 0.15:
            reason = rng.choice(["preempted", "node_failure", "lost"])
            events.append(RunFailed(at=at, job_id=job_id, tenant=tenant, run_id=run_id, reason=reason))
            continue  # infrastructure failure: the job runs again
        if roll < 0.20:
            events.append(JobCancelled(at=at, job_id=job_id, tenant=tenant, run_id=run_id))
        elif roll < 0.25:
            events.append(RunFailed(at=at, job_id=job_id, tenant=tenant, run_id=run_id, reason="workload_error"))
        elif at < DEC1 + 3 * 86_400:
            events.append(RunSucceeded(at=at, job_id=job_id, tenant=tenant, run_id=run_id))
        break  # otherwise the run is still open
    return events


def generate(total: int, seed: int) -> list[tuple[str, JobEvent]]:
    """``total`` deliveries (event id, event), roughly in time order."""
    rng = random.Random(seed)
    events: list[JobEvent] = []
    n = 0
    while len(events) < total:
        events.extend(job_events(rng, n))
        n += 1
    # Publication order: by time, with a few minutes of jitter between producers.
    events.sort(key=lambda e: e.at + rng.random() * 300)
    published = [(str(seq), e) for seq, e in enumerate(events, start=1)]
    deliveries: list[tuple[str, JobEvent]] = []
    for seq, event in published:
        deliveries.append((seq, event))
        roll = rng.random()
        if roll < 0.01:
            deliveries.append((seq, event))  # redelivered: lost ack
        elif roll < 0.015:
            deliveries.append((f"re-{seq}", event))  # published again under a new sequence
    return deliveries[:total]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000, help="lifecycle events to ingest (default 1,000,000)")
    parser.add_argument("--batch", type=int, default=1000, help="events per apply() transaction (default 1000)")
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--period", default="2026-11")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory and print its path")
    args = parser.parse_args()

    t = time.perf_counter()
    deliveries = generate(args.events, args.seed)
    print(f"generated {len(deliveries):,} events in {time.perf_counter() - t:.1f} s (seed {args.seed})")
    gc.freeze()  # the generated events live to the end: keep the collector from rescanning them

    tmp = Path(tempfile.mkdtemp(prefix="trainyard-bench-"))
    ledger = LedgerWriter(f"sqlite:///{tmp / 'ledger.db'}")
    ledger.create_schema()
    t = time.perf_counter()
    applied = 0
    for i in range(0, len(deliveries), args.batch):
        applied += ledger.apply(deliveries[i : i + args.batch])
    elapsed = time.perf_counter() - t
    del deliveries
    gc.unfreeze()
    gc.collect()
    print(
        f"ingest: {args.events:,} events ({applied:,} new) in {elapsed:.1f} s "
        f"= {args.events / elapsed:,.0f} events/s, batches of {args.batch}"
    )
    runs = ledger.runs()
    print(f"ledger: {len(runs):,} runs, {ledger.total_gpu_seconds() / 3600:,.0f} GPU-hours in ended runs")

    for fmt in ("csv", "parquet"):
        t = time.perf_counter()
        data = chargeback(ledger, args.period, RATE_CARD, fmt, now=DEC1)  # type: ignore[arg-type]
        elapsed = time.perf_counter() - t
        rows = data.count(b"\n") - 1 if fmt == "csv" else None
        shown = f", {rows:,} rows" if rows is not None else ""
        print(f"export {args.period} as {fmt}: {elapsed:.2f} s, {len(data) / 1e6:.1f} MB{shown}")
        (tmp / f"chargeback-{args.period}.{fmt}").write_bytes(data)
    ledger.close()
    if args.keep:
        print(f"kept {tmp}")
    else:
        for path in tmp.iterdir():
            path.unlink()
        tmp.rmdir()


if __name__ == "__main__":
    main()
