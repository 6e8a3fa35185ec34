"""A list filtered by status is served from the fold's index of that status,
so an old job is found however many newer jobs came after it (the filter used
to look only at the newest max(10 x limit, 1,000) jobs)."""

from __future__ import annotations

import httpx

from trainyard.bus import Bus, PublishRequest
from trainyard.domain import JobSpec, Role
from trainyard.events import (
    JobAccepted,
    JobAdmitted,
    JobCancelled,
    JobPlaced,
    ReplicaPlacement,
    RunStarted,
    RunSucceeded,
    job_subject,
)
from trainyard.store import Store, views
from trainyard.testing.auth import Callers
from trainyard.testing.publish import publish_event
from trainyard.testing.streams import project
from trainyard_gateway.jobs import JobOperations
from trainyard_gateway.rest import create_app


def spec(tenant: str) -> JobSpec:
    return JobSpec(
        tenant=tenant, queue="default", roles=[Role(name="trainer", replicas=1, gpus_per_replica=1)], name="j"
    )


async def start_running(bus: Bus, job_id: str, tenant: str) -> None:
    run = f"{job_id}-r1"
    placed = [ReplicaPlacement(role="trainer", replica=0, rank=0, node_id="n1", gpus=[0])]
    events = [
        JobAccepted(at=1.0, job_id=job_id, spec=spec(tenant), submitted_at=0.5),
        JobAdmitted(at=2.0, job_id=job_id, tenant=tenant, run_id=run, attempt=1),
        JobPlaced(at=3.0, job_id=job_id, tenant=tenant, run_id=run, cluster="c1", replicas=placed),
        RunStarted(at=4.0, job_id=job_id, tenant=tenant, run_id=run),
    ]
    for i, event in enumerate(events):
        await publish_event(bus, event, msg_id=f"{job_id}:{i}")


async def short_jobs(bus: Bus, tenant: str, count: int) -> None:
    """``count`` jobs accepted and cancelled at once: finished, newer than anything before."""
    for start in range(0, count, 200):
        requests = []
        for n in range(start, min(count, start + 200)):
            job_id = f"short-{tenant}-{n}"
            accepted = JobAccepted(at=5.0, job_id=job_id, spec=spec(tenant), submitted_at=5.0)
            requests.append(PublishRequest(job_subject(accepted), accepted, f"{job_id}:a"))
        assert not [r for r in await bus.publish_many(requests) if isinstance(r, Exception)]
        requests = []
        for n in range(start, min(count, start + 200)):
            job_id = f"short-{tenant}-{n}"
            cancelled = JobCancelled(at=6.0, job_id=job_id, tenant=tenant)
            requests.append(PublishRequest(job_subject(cancelled), cancelled, f"{job_id}:c"))
        assert not [r for r in await bus.publish_many(requests) if isinstance(r, Exception)]


async def test_a_running_job_older_than_a_thousand_finished_ones_is_listed_by_the_status_filter(
    bus: Bus, store: Store
) -> None:
    await start_running(bus, "old-runner", "acme")
    await start_running(bus, "beta-runner", "beta")
    await short_jobs(bus, "acme", 1_050)
    await project(bus, store, "JOBS")

    running = await views.list_jobs(store, tenant="acme", status="running", limit=10)
    everyone = await views.list_jobs(store, status="running", limit=10)
    cancelled = await views.list_jobs(store, tenant="acme", status="cancelled", limit=1_000)

    assert [j.job_id for j in running] == ["old-runner"]
    assert sorted(j.job_id for j in everyone) == ["beta-runner", "old-runner"]
    assert len(cancelled) == 1_000 and cancelled[0].job_id == "short-acme-1049"  # newest first
    assert await views.list_jobs(store, tenant="beta", status="cancelled") == []


async def test_a_job_leaves_its_old_status_index_when_its_status_changes(bus: Bus, store: Store) -> None:
    await start_running(bus, "j1", "acme")
    await publish_event(bus, RunSucceeded(at=9.0, job_id="j1", tenant="acme", run_id="j1-r1"), msg_id="done")
    await project(bus, store, "JOBS")

    assert await views.list_jobs(store, tenant="acme", status="running") == []
    assert [j.job_id for j in await views.list_jobs(store, tenant="acme", status="succeeded")] == ["j1"]
    assert [j.job_id for j in await views.list_jobs(store, status="succeeded")] == ["j1"]
    assert [j.job_id for j in await views.list_jobs(store, tenant="acme")] == ["j1"]


async def test_a_projection_folded_before_the_status_indexes_is_read_the_slow_way_and_still_finds_every_match(
    bus: Bus, store: Store
) -> None:
    await start_running(bus, "old-runner", "acme")
    await short_jobs(bus, "acme", 1_050)
    await project(bus, store, "JOBS")
    stale = [k async for k in store.redis.scan_iter(match=store.key("*bystatus:*"))]
    await store.redis.delete(*stale)  # as the fold before this version left it

    running = await views.list_jobs(store, tenant="acme", status="running", limit=10)
    cancelled = await views.list_jobs(store, status="cancelled", limit=3)

    assert [j.job_id for j in running] == ["old-runner"]
    assert [j.job_id for j in cancelled] == ["short-acme-1049", "short-acme-1048", "short-acme-1047"]


async def test_the_api_lists_the_old_running_job_by_its_status(bus: Bus, store: Store, callers: Callers) -> None:
    """What ``GET /v1/jobs?status=running`` and ``trainyard jobs --status running`` read."""
    await start_running(bus, "old-runner", "acme")
    await short_jobs(bus, "acme", 1_050)
    await project(bus, store, "JOBS")
    app = create_app(JobOperations(bus, store), store, callers.authenticator)

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as api:
        answer = await api.get("/v1/jobs", params={"status": "running", "limit": 10}, headers=callers.headers("acme"))

    assert answer.status_code == 200 and [j["job_id"] for j in answer.json()["jobs"]] == ["old-runner"]
