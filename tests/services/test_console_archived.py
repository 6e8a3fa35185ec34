"""The console's jobs list and job page after retention took finished jobs out
of Redis: the list shows them with "archived too", the job page always."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from gateway_fixtures import client, log_in

from trainyard.bus import Bus
from trainyard.domain import JobSpec, Role
from trainyard.events import JobAccepted, JobCancelled
from trainyard.ledger.archive import JobArchive
from trainyard.settings import Settings
from trainyard.store import Store
from trainyard.store.retention import sweep
from trainyard.testing.auth import Callers
from trainyard.testing.publish import publish_event
from trainyard.testing.streams import project
from trainyard_gateway.console import app as console_app
from trainyard_gateway.jobs import JobOperations
from trainyard_gateway.rest import create_app


@pytest.fixture
async def browser(bus: Bus, store: Store, callers: Callers, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """An admin's console over a projection that forgot "old-1" (archived) and holds "new-1"."""
    spec = JobSpec(tenant="acme", queue="default", roles=[Role(name="t")], simulated_duration_s=1)
    for job_id, at in (("old-1", 1_000.0), ("new-1", 9_000.0)):
        await publish_event(bus, JobAccepted(at=at, job_id=job_id, spec=spec, submitted_at=at), msg_id=f"{job_id}:a")
        await publish_event(bus, JobCancelled(at=at + 1, job_id=job_id, tenant="acme"), msg_id=f"{job_id}:c")
    await project(bus, store, "JOBS")
    url = f"sqlite:///{tmp_path}/ledger.db"
    archive = JobArchive(url)
    archive.create_schema()
    assert await sweep(store, archive, cutoff=5_000.0) == 1
    ops = JobOperations(bus, store, archive=archive)
    routers = [console_app.build_router(ops, store, callers.authenticator, Settings(ledger_url=url))]
    async with client(create_app(ops, store, callers.authenticator, routers=routers)) as browser:
        await log_in(browser, callers.tokens["admin"])
        yield browser
    archive.close()


async def test_the_jobs_list_shows_archived_jobs_when_asked_and_the_job_page_always(browser: httpx.AsyncClient) -> None:
    plain = (await browser.get("/jobs")).text
    archived = (await browser.get("/jobs", params={"archived": "1"})).text
    page = await browser.get("/jobs/old-1")

    assert "new-1" in plain and "old-1" not in plain
    assert "new-1" in archived and "old-1" in archived and 'value="1" checked' in archived
    assert "archived=1" in archived  # the live rows keep asking for them
    assert page.status_code == 200 and "cancelled" in page.text
