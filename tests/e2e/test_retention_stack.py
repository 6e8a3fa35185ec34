"""Retention through the whole stack, every service in its own process on the
locked bus: with a retention of seconds, admission archives finished jobs and
takes them out of Redis, and the gateway still answers for them; admission
keeps snapshots of the JOBS projection in the ledger database."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from trainyard.domain import JobSpec, Role
from trainyard.ledger.archive import JobArchive
from trainyard.ledger.snapshots import SnapshotStore
from trainyard.local import LocalStack
from trainyard.store import Store
from trainyard.testing.chaos import submit_rest
from trainyard.testing.waiting import eventually

pytestmark = pytest.mark.e2e

JOBS = [f"kept-{i}" for i in range(6)]


@pytest.fixture(autouse=True)
def short_retention(monkeypatch: pytest.MonkeyPatch) -> None:
    """Read by every service the stack starts (it passes the environment on)."""
    monkeypatch.setenv("TRAINYARD_JOB_RETENTION_S", "2")
    monkeypatch.setenv("TRAINYARD_RETENTION_SWEEP_INTERVAL_S", "0.2")
    monkeypatch.setenv("TRAINYARD_JOBS_SNAPSHOT_INTERVAL_S", "0.5")


async def test_finished_jobs_leave_redis_for_the_archive_and_are_still_answered_for(stack: LocalStack) -> None:
    assert stack.redis
    store = Store.from_url(stack.redis.admin_url)
    spec = JobSpec(tenant="acme", queue="default", roles=[Role(name="t", gpus_per_replica=1)], simulated_duration_s=0.2)
    try:
        async with httpx.AsyncClient(base_url=stack.api_url, timeout=10, headers=stack.admin_headers()) as api:
            for job_id in JOBS:
                await submit_rest(api, job_id, spec)

            async def gone_from_redis() -> bool:
                return not any([await store.redis.exists(store.key("job", job_id)) for job_id in JOBS])

            await eventually(gone_from_redis, timeout=120, what="every job swept out of Redis")

            for job_id in JOBS:
                answer = await api.get(f"/v1/jobs/{job_id}")
                assert answer.status_code == 200 and answer.json()["status"] == "succeeded", answer.text
            listed = (await api.get("/v1/jobs", params={"tenant": "acme", "archived": "true"})).json()["jobs"]
            assert sorted(j["job_id"] for j in listed) == JOBS
            assert (await api.get("/v1/jobs", params={"tenant": "acme"})).json()["jobs"] == []
    finally:
        await store.close()

    archive = JobArchive(stack.ledger_url)
    snapshots = SnapshotStore(stack.ledger_url)
    try:
        assert sorted(j.job_id for j in await asyncio.to_thread(archive.list)) == JOBS
        snapshot = await asyncio.to_thread(snapshots.get, "jobs")
        assert snapshot is not None and snapshot.seq > 0
    finally:
        archive.close()
        snapshots.close()
    assert stack.exited() == {}
