"""Lists that include archived jobs read the projection, then the job archive,
in one order: paged through, they give every job once, in the order the
projection listed them before retention took the old ones away."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from trainyard._pb.trainyard.v1 import jobs_pb2 as pb
from trainyard._pb.trainyard.v1 import jobs_pb2_grpc as pb_grpc
from trainyard.bus import Bus, PublishRequest
from trainyard.domain import JobSpec, Role
from trainyard.events import JobAccepted, JobCancelled, JobRejected, job_subject
from trainyard.ledger.archive import JobArchive
from trainyard.local.servers import free_port
from trainyard.store import Store
from trainyard.store.job_pages import JobQuery, Position, page_jobs
from trainyard.store.retention import sweep
from trainyard.testing.auth import Callers
from trainyard.testing.streams import project
from trainyard_gateway.archived_lists import with_archived
from trainyard_gateway.grpc_server import start_grpc
from trainyard_gateway.jobs import JobOperations
from trainyard_gateway.rest import create_app

T0 = 1_793_491_200.0  # 2026-11-01T00:00:00Z
DAY = 86_400.0


def spec(tenant: str) -> JobSpec:
    role = Role(name="trainer", replicas=1, gpus_per_replica=1)
    return JobSpec(tenant=tenant, queue="default", roles=[role], simulated_duration_s=60)


@pytest.fixture
def archive(tmp_path: Path) -> Iterator[JobArchive]:
    archive = JobArchive(f"sqlite:///{tmp_path}/ledger.db")
    archive.create_schema()
    yield archive
    archive.close()


async def _jobs(bus: Bus) -> None:
    """40 jobs of two tenants, one a day: every third rejected, the others
    cancelled an hour after they were accepted but every fourth left pending."""
    requests = []
    for n in range(40):
        tenant, job_id, at = ("acme", "beta")[n % 2], f"j{n:02d}", T0 + n * DAY
        if n % 3 == 0:
            event: object = JobRejected(at=at, job_id=job_id, tenant=tenant, errors=[])
            requests.append(PublishRequest(job_subject(event), event, f"{job_id}:r"))
            continue
        accepted = JobAccepted(at=at, job_id=job_id, spec=spec(tenant), submitted_at=at)
        requests.append(PublishRequest(job_subject(accepted), accepted, f"{job_id}:a"))
        if n % 4:
            cancelled = JobCancelled(at=at + 3600, job_id=job_id, tenant=tenant)
            requests.append(PublishRequest(job_subject(cancelled), cancelled, f"{job_id}:c"))
    assert not [r for r in await bus.publish_many(requests) if isinstance(r, Exception)]


async def _walk(store: Store, query: JobQuery, limit: int, archive: JobArchive | None) -> list[str]:
    """Every job id of ``query``, page by page."""
    ids: list[str] = []
    after: Position | None = None
    for _ in range(100):
        page = await page_jobs(store, query, limit, after)
        if archive is not None:
            page = await with_archived(store, archive, query, limit, after, page)
        assert len(page.jobs) <= limit
        ids += [j.job_id for j in page.jobs]
        if page.next is None:
            return ids
        after = page.next
    raise AssertionError("the list did not end")


QUERIES = [
    JobQuery(),
    JobQuery(newest_first=False),
    JobQuery(tenant="beta"),
    JobQuery(status="cancelled"),
    JobQuery(tenant="acme", status="rejected", newest_first=False),
    JobQuery(submitted_after=T0 + 10 * DAY, submitted_before=T0 + 30 * DAY),
]


@pytest.mark.parametrize("query", QUERIES, ids=lambda q: repr(q)[8:])
@pytest.mark.parametrize("limit", [1, 7])
async def test_a_list_with_archived_jobs_is_the_list_before_retention(
    bus: Bus, store: Store, archive: JobArchive, query: JobQuery, limit: int
) -> None:
    await _jobs(bus)
    await project(bus, store, "JOBS")
    before = await _walk(store, query, 1000, None)
    assert before  # every query lists some jobs

    assert await sweep(store, archive, cutoff=T0 + 20 * DAY) > 10  # the older half leaves Redis

    assert await _walk(store, query, limit, archive) == before
    left = await _walk(store, query, 1000, None)
    assert len(left) < len(before)  # without the archive, the old ones are gone


async def test_rest_and_grpc_list_archived_jobs_when_asked(
    bus: Bus, store: Store, archive: JobArchive, callers: Callers
) -> None:
    """What ``GET /v1/jobs?archived=true``, ``trainyard jobs --all`` and gRPC ``ListJobs``
    with ``archived`` read, a page at a time."""
    await _jobs(bus)
    await project(bus, store, "JOBS")
    before = await _walk(store, JobQuery(tenant="acme"), 1000, None)
    assert await sweep(store, archive, cutoff=T0 + 20 * DAY) > 10
    app = create_app(JobOperations(bus, store, archive=archive), store, callers.authenticator)

    async def listed(**params: object) -> list[str]:
        ids, cursor = [], None
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as api:
            while True:
                query = {"limit": 3, **params} | ({"cursor": cursor} if cursor else {})
                answer = await api.get("/v1/jobs", params=query, headers=callers.headers("acme"))
                assert answer.status_code == 200, answer.text
                ids += [j["job_id"] for j in answer.json()["jobs"]]
                cursor = answer.json()["next_cursor"]
                if cursor is None:
                    return ids

    assert await listed(archived="true") == before
    assert len(await listed()) < len(before)  # by default, the projection's jobs only

    port = free_port()  # gRPC ListJobs asks the same with archived
    server = await start_grpc(JobOperations(bus, store, archive=archive), callers.authenticator, "127.0.0.1", port)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.JobServiceStub(channel)
            ids, cursor = [], ""
            while True:
                request = pb.ListJobsRequest(tenant="acme", limit=4, cursor=cursor, archived=True)
                answer = await stub.ListJobs(request, metadata=callers.metadata("acme"), timeout=10)
                ids += [j.job_id for j in answer.jobs]
                if not (cursor := answer.next_cursor):
                    break
    finally:
        await server.stop(0)
    assert ids == before
