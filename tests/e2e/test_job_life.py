"""A job's whole life through real NATS JetStream and Redis, every service in
its own process: submitted -> accepted -> admitted -> placed -> running ->
succeeded -> metered.  Half the jobs come through REST, half as events on the
portal's intake subject; one test SIGKILLs each service in the middle."""

from __future__ import annotations

import asyncio
import random
import time

import httpx
import pytest

from trainyard.bus import Bus
from trainyard.core.invariants import check_job_log
from trainyard.domain import JobSpec, Role
from trainyard.events import JobPlaced, RunStarted, RunSucceeded
from trainyard.ledger import Ledger
from trainyard.local import LocalStack
from trainyard.store import Store, views
from trainyard.testing.auth import issue
from trainyard.testing.chaos import submit_event, submit_rest
from trainyard.testing.streams import read_job_events

pytestmark = pytest.mark.e2e

JOBS = 300


def workload(n: int, seed: int = 7) -> list[tuple[str, JobSpec]]:
    """Single-GPU to 8-GPU jobs and some 2-node gangs, 0.2-0.8 s each."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        tenant = rng.choice(["acme", "globex", "initech"])
        shape = rng.choice([(1, 1), (1, 2), (1, 4), (1, 8), (2, 8), (4, 1)])
        spec = JobSpec(
            tenant=tenant,
            queue="default",
            name=f"job-{i}",
            roles=[Role(name="trainer", replicas=shape[0], gpus_per_replica=shape[1])],
            simulated_duration_s=round(rng.uniform(0.2, 0.8), 2),
        )
        out.append((f"e2e-{i:04d}", spec))
    return out


async def wait_all_succeeded(store: Store, n: int, timeout: float) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    counts: dict[str, int] = {}
    while time.monotonic() < deadline:
        counts = await views.status_counts(store)
        if counts.get("succeeded", 0) == n:
            return counts
        await asyncio.sleep(0.25)
    raise AssertionError(f"not every job succeeded in {timeout}s: {counts}")


async def wait_ledger(ledger: Ledger, n: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = await asyncio.to_thread(ledger.runs)
        if sum(1 for r in runs if r.ended_at is not None) >= n:
            return
        await asyncio.sleep(0.25)
    raise AssertionError("the ledger did not close every run in time")


async def check_exactly_once(stack: LocalStack, bus: Bus, store: Store, jobs: list[tuple[str, JobSpec]]) -> None:
    """Every job succeeded exactly once, no GPU was given twice, and the
    ledger's GPU-seconds equal the runs' intervals on the log."""
    events = await read_job_events(bus)
    fold = check_job_log(events)
    assert fold.violations == []
    assert await views.violations(store) == []
    expected = {job_id for job_id, _ in jobs}
    assert {j for j, s in fold.status.items() if s == "succeeded"} == expected
    assert all(fold.successes[j] == 1 for j in expected)

    started = {e.run_id: e.at for e in events if isinstance(e, RunStarted)}
    ended = {e.run_id: e.at for e in events if isinstance(e, RunSucceeded)}
    gpus = {e.run_id: sum(len(r.gpus) for r in e.replicas) for e in events if isinstance(e, JobPlaced)}
    successful_runs = {
        e.run_id for e in events if isinstance(e, RunSucceeded) and fold.current_run[e.job_id] == e.run_id
    }
    assert len(successful_runs) == len(expected)

    ledger = Ledger(stack.ledger_url)
    try:
        await wait_ledger(ledger, len(successful_runs), timeout=60)
        rows = {r.run_id: r for r in await asyncio.to_thread(ledger.runs)}
    finally:
        ledger.close()
    for run_id in successful_runs:
        row = rows[run_id]
        assert row.gpus == gpus[run_id]
        assert row.gpu_seconds == pytest.approx(gpus[run_id] * (ended[run_id] - started[run_id]), abs=1e-6)
    ledger_total = sum(rows[r].gpu_seconds for r in successful_runs)
    log_total = sum(gpus[r] * (ended[r] - started[r]) for r in successful_runs)
    assert ledger_total == pytest.approx(log_total, abs=1e-3)


async def submit_all(stack: LocalStack, bus: Bus, jobs: list[tuple[str, JobSpec]]) -> None:
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=10, headers=stack.admin_headers()) as client:
        sem = asyncio.Semaphore(32)

        async def one(i: int, job_id: str, spec: JobSpec) -> None:
            async with sem:
                if i % 2 == 0:
                    await submit_rest(client, job_id, spec)
                else:
                    await submit_event(bus, job_id, spec)

        await asyncio.gather(*(one(i, j, s) for i, (j, s) in enumerate(jobs)))


async def test_a_few_hundred_jobs_each_succeed_exactly_once_and_are_metered(stack: LocalStack) -> None:
    assert stack.nats and stack.redis
    bus = await Bus.connect(stack.nats.admin_url, "e2e")
    store = Store.from_url(stack.redis.admin_url)
    jobs = workload(JOBS)
    try:
        await submit_all(stack, bus, jobs)
        await wait_all_succeeded(store, len(jobs), timeout=180)
        await check_exactly_once(stack, bus, store, jobs)
        assert stack.exited() == {}
        # What tenants read through the API is what the ledger holds.
        ledger = Ledger(stack.ledger_url)
        try:
            by_tenant = await asyncio.to_thread(ledger.usage, None, None, None, None, ("tenant",))
        finally:
            ledger.close()
        callers = await issue(bus)
        async with httpx.AsyncClient(base_url=stack.api_url, timeout=10) as client:
            rows = (await client.get("/v1/usage", headers=callers.headers("finance"))).json()
            acme = (await client.get("/v1/usage", headers=callers.headers("acme"))).json()
        assert sum(r["gpu_seconds"] for r in rows) == pytest.approx(sum(by_tenant.values()), abs=0.01)
        assert {r["tenant"] for r in acme} == {"acme"}
        assert sum(r["gpu_seconds"] for r in acme) == pytest.approx(by_tenant[("acme",)], abs=0.01)
    finally:
        await bus.close()
        await store.close()


@pytest.mark.parametrize(
    "victims",
    [
        pytest.param(
            ["admission", "placement", "emulator", "accounting", "gateway", "health"], id="each service in turn"
        )
    ],
)
async def test_sigkill_of_every_service_mid_run_loses_and_duplicates_nothing(
    stack: LocalStack, victims: list[str]
) -> None:
    assert stack.nats and stack.redis
    bus = await Bus.connect(stack.nats.admin_url, "e2e")
    store = Store.from_url(stack.redis.admin_url)
    jobs = workload(JOBS, seed=11)
    try:
        submitting = asyncio.create_task(submit_all(stack, bus, jobs))
        for victim in victims:
            await asyncio.sleep(1.0)
            stack.kill(victim)
            await asyncio.sleep(0.5)
            stack.start_service(victim)
        await submitting
        await wait_all_succeeded(store, len(jobs), timeout=240)
        await check_exactly_once(stack, bus, store, jobs)
    finally:
        await bus.close()
        await store.close()


async def test_losing_redis_mid_run_loses_and_duplicates_nothing(stack: LocalStack) -> None:
    """Redis holds only derived state: wipe it in the middle of the run and the
    projectors rebuild it from the streams while the deciders wait for them."""
    assert stack.nats and stack.redis
    bus = await Bus.connect(stack.nats.admin_url, "e2e")
    store = Store.from_url(stack.redis.admin_url)
    jobs = workload(150, seed=13)
    try:
        submitting = asyncio.create_task(submit_all(stack, bus, jobs))
        await asyncio.sleep(1.5)
        await store.redis.flushall()
        await submitting
        await wait_all_succeeded(store, len(jobs), timeout=180)
        await check_exactly_once(stack, bus, store, jobs)
        assert stack.exited() == {}
    finally:
        await bus.close()
        await store.close()
