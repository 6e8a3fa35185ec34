"""The ledger on a real PostgreSQL, with consumers racing each other.

Runs when TRAINYARD_TEST_POSTGRES_URL is set (e.g.
``postgresql+psycopg://postgres@127.0.0.1:5432/test``); if it is set and the
server is down the tests fail.  Several consumers apply overlapping batches
of the same stream at once, as a consumer group does during redelivery; the
ledger must still charge every run exactly once.
"""

from __future__ import annotations

import os
import random
import threading
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from trainyard.domain.job import JobSpec, Role
from trainyard.events.jobs import (
    JobAccepted,
    JobAdmitted,
    JobEvent,
    JobPlaced,
    ReplicaPlacement,
    RunFailed,
    RunStarted,
    RunSucceeded,
)
from trainyard_accounting.writer import LedgerWriter

POSTGRES_ENV = "TRAINYARD_TEST_POSTGRES_URL"
T0 = 1_793_491_200.0  # 2026-11-01T00:00:00Z

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.skipif(not os.environ.get(POSTGRES_ENV), reason=f"set {POSTGRES_ENV} to run against PostgreSQL"),
]


@pytest.fixture
def prefix() -> Iterator[str]:
    url = os.environ[POSTGRES_ENV]
    name = f"t{uuid.uuid4().hex[:12]}_"
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("select 1"))
    except Exception as exc:  # noqa: BLE001 - a configured server that is down fails the test
        pytest.fail(f"{POSTGRES_ENV}={url} is set but PostgreSQL cannot be reached: {exc}", pytrace=False)
    finally:
        engine.dispose()
    ledger = LedgerWriter(url, prefix=name)
    ledger.create_schema()
    yield name
    ledger.drop_schema()
    ledger.close()


def stream(runs: int, seed: int) -> tuple[list[tuple[str, JobEvent]], float]:
    """A stream of lifecycle events for ``runs`` runs, and their GPU-seconds."""
    rng = random.Random(seed)
    events: list[JobEvent] = []
    expected = 0.0
    for i in range(runs):
        job, run, tenant, gpus = f"j{i // 2}", f"r{i}", f"t{i % 3}", rng.choice([1, 8, 16])
        if i % 2 == 0:
            spec = JobSpec(
                tenant=tenant,
                queue="q",
                roles=[Role(name="w", gpus_per_replica=1, replicas=gpus)],
                simulated_duration_s=1,
            )
            events.append(JobAccepted(at=T0, job_id=job, spec=spec, submitted_at=T0))
        start = T0 + rng.randrange(0, 86_400)
        end = start + rng.randrange(0, 36_000)
        replicas = [ReplicaPlacement(role="w", replica=k, rank=k, node_id=f"n{k}", gpus=[0]) for k in range(gpus)]
        events += [
            JobAdmitted(at=start - 2, job_id=job, tenant=tenant, run_id=run, attempt=1),
            JobPlaced(at=start - 1, job_id=job, tenant=tenant, run_id=run, cluster="c", replicas=replicas),
            RunStarted(at=start, job_id=job, tenant=tenant, run_id=run),
        ]
        if i % 5 == 0:
            events.append(RunFailed(at=end, job_id=job, tenant=tenant, run_id=run, reason="preempted"))
        else:
            events.append(RunSucceeded(at=end, job_id=job, tenant=tenant, run_id=run))
        expected += gpus * (end - start)
    return [(str(seq), e) for seq, e in enumerate(events, start=1)], expected


def test_racing_consumers_with_redelivery_charge_every_run_exactly_once(prefix: str):
    url = os.environ[POSTGRES_ENV]
    events, expected = stream(runs=300, seed=7)
    errors: list[BaseException] = []

    def consume(worker: int) -> None:
        # Each consumer sees the whole stream, shuffled, in batches: every
        # event reaches the ledger several times, from different consumers.
        rng = random.Random(worker)
        mine = events[:]
        rng.shuffle(mine)
        ledger = LedgerWriter(url, prefix=prefix)
        try:
            for i in range(0, len(mine), 50):
                ledger.apply(mine[i : i + 50])
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            errors.append(exc)
        finally:
            ledger.close()

    threads = [threading.Thread(target=consume, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    ledger = LedgerWriter(url, prefix=prefix)
    assert ledger.applied_count() == len(events)
    assert len(ledger.runs()) == 300
    assert ledger.total_gpu_seconds() == pytest.approx(expected)
    ledger.close()


def test_the_same_batch_applied_by_two_ledgers_at_once_counts_once(prefix: str):
    url = os.environ[POSTGRES_ENV]
    events, expected = stream(runs=50, seed=11)
    barrier = threading.Barrier(2)
    counts: list[int] = []

    def consume() -> None:
        ledger = LedgerWriter(url, prefix=prefix)
        barrier.wait()
        counts.append(ledger.apply(events))
        ledger.close()

    threads = [threading.Thread(target=consume) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(counts) == [0, len(events)]
    ledger = LedgerWriter(url, prefix=prefix)
    assert ledger.total_gpu_seconds() == pytest.approx(expected)
    ledger.close()
