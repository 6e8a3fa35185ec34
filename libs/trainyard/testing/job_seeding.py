"""Many jobs in the JOBS stream at once, for tests and benchmarks of lists:
job ``i`` is accepted for tenant ``TENANTS[i % len(TENANTS)]``, submitted at
``SUBMITTED_AT + i`` seconds, and every third one (``i % 3 == 0``) is
cancelled before it ever runs."""

from __future__ import annotations

import asyncio

from trainyard.bus import Bus, PublishRequest
from trainyard.domain import JobSpec, Role
from trainyard.events import JobAccepted, JobCancelled, job_subject
from trainyard.store import Projector, Store

TENANTS = ("acme", "globex")
SUBMITTED_AT = 1_000_000.0


def job_id(i: int) -> str:
    return f"p-{i:07d}"


def tenant_of(i: int) -> str:
    return TENANTS[i % len(TENANTS)]


def status_of(i: int) -> str:
    return "cancelled" if i % 3 == 0 else "pending"


def job_events(first: int, count: int) -> list[PublishRequest]:
    """The events of jobs ``first`` to ``first + count - 1``: every acceptance, then the cancellations."""
    accepted, cancelled = [], []
    for i in range(first, first + count):
        tenant = tenant_of(i)
        spec = JobSpec(tenant=tenant, queue="default", name=f"job-{i}", roles=[Role(name="t", gpus_per_replica=1)])
        event = JobAccepted(at=SUBMITTED_AT + i, job_id=job_id(i), spec=spec, submitted_at=SUBMITTED_AT + i)
        accepted.append(PublishRequest(job_subject(event), event, f"{job_id(i)}:a"))
        if status_of(i) == "cancelled":
            end = JobCancelled(at=SUBMITTED_AT + i, job_id=job_id(i), tenant=tenant)
            cancelled.append(PublishRequest(job_subject(end), end, f"{job_id(i)}:c"))
    return accepted + cancelled


async def publish_jobs(bus: Bus, first: int, count: int, chunk: int = 2000) -> None:
    """Publish :func:`job_events` of jobs ``first`` to ``first + count - 1``, ``chunk`` events at a time."""
    requests = job_events(first, count)
    for start in range(0, len(requests), chunk):
        failed = [r for r in await bus.publish_many(requests[start : start + chunk]) if isinstance(r, Exception)]
        if failed:
            raise failed[0]


async def fold_all(bus: Bus, store: Store, projector: Projector) -> None:
    """Wait until ``projector`` (running) has folded everything the JOBS stream holds."""
    await projector.wait_for((await bus.js.stream_info("JOBS")).state.last_seq)


def run_projector(bus: Bus, store: Store) -> tuple[Projector, asyncio.Event, asyncio.Task[None]]:
    """A JOBS projector running until the event is set (then await the task)."""
    projector = Projector(bus, store, "JOBS")
    stop = asyncio.Event()
    return projector, stop, asyncio.create_task(projector.run(stop))
