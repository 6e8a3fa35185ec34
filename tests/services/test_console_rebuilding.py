"""While Redis has lost the projections, every console page that reads them
answers a 503 page with Retry-After, never a job shown as missing, an empty
fleet or an older state; once rebuilt, each page shows what it showed before.
Real NATS and Redis, a logged-in admin session."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from gateway_fixtures import client, csrf_of, gateway_app, log_in

from trainyard.bus import Bus
from trainyard.config.store import ConfigStore
from trainyard.domain import NodeInfo
from trainyard.domain.job import JobSpec, Role
from trainyard.events import JobAccepted, JobAdmitted, JobPlaced, NodeRegistered, RunStarted, RunSucceeded, subjects
from trainyard.events.jobs import ReplicaPlacement
from trainyard.settings import Settings
from trainyard.store import Store
from trainyard.testing.auth import Callers
from trainyard.testing.publish import publish_event
from trainyard.testing.streams import project
from trainyard.testing.tenancy import one_team

#: Every console page that reads the JOBS or NODES projection.
PAGES = (
    "/jobs",
    "/jobs?status=succeeded",
    "/jobs/done-1",
    "/jobs/run-1",
    "/cluster",
    "/nodes",
    "/nodes/n1",
    "/admin/tenancy",
)


async def run_a_job(bus: Bus, job_id: str, gpus: list[int], succeed: bool) -> None:
    spec = JobSpec(tenant="acme", queue="default", roles=[Role(name="trainer", replicas=1, gpus_per_replica=len(gpus))])
    run_id = f"{job_id}-r1"
    placed = [ReplicaPlacement(role="trainer", replica=0, rank=0, node_id="n1", gpus=gpus)]
    events: list[Any] = [
        JobAccepted(at=1.0, job_id=job_id, spec=spec, submitted_at=0.5),
        JobAdmitted(at=2.0, job_id=job_id, tenant="acme", run_id=run_id, attempt=1),
        JobPlaced(at=3.0, job_id=job_id, tenant="acme", run_id=run_id, cluster="c1", replicas=placed),
        RunStarted(at=4.0, job_id=job_id, tenant="acme", run_id=run_id),
    ]
    if succeed:
        events.append(RunSucceeded(at=9.0, job_id=job_id, tenant="acme", run_id=run_id))
    for i, event in enumerate(events):
        await publish_event(bus, event, msg_id=f"{job_id}:{i}")


@pytest.fixture
async def admin_browser(bus: Bus, store: Store, callers: Callers, tmp_path: Any) -> AsyncIterator[httpx.AsyncClient]:
    node = NodeInfo(node_id="n1", cluster="c1", gpu_type="H100", gpus=8)
    await bus.publish(subjects.node("c1", "n1"), NodeRegistered(at=0.0, node=node, boot_id="b1"), msg_id="reg-n1")
    await run_a_job(bus, "done-1", [0, 1], succeed=True)
    await run_a_job(bus, "run-1", [2, 3, 4, 5], succeed=False)
    await (await ConfigStore.open(bus)).apply(one_team("acme", gpus=8), actor="test:admin")
    await project(bus, store, "NODES", "JOBS")
    app = gateway_app(bus, store, callers.authenticator, Settings(ledger_url=f"sqlite:///{tmp_path}/ledger.db"))
    async with client(app) as browser:
        await log_in(browser, callers.tokens["admin"])
        yield browser


def shows_what_it_should(path: str, html: str) -> None:
    """What a caught-up page shows of the two jobs and the node."""
    if path in ("/jobs", "/jobs?status=succeeded", "/jobs/done-1"):
        assert "done-1" in html and "succeeded" in html, html
    if path in ("/jobs", "/jobs/run-1"):
        assert "run-1" in html and "running" in html, html
    if path == "/jobs?status=succeeded":
        assert "run-1" not in html, html
    if path in ("/cluster", "/nodes/n1"):
        assert "n1" in html and "run-1" in html, html  # the node and the job holding its GPUs
    if path == "/admin/tenancy":
        assert "acme/default" in html and ">4<" in html.replace(" ", ""), html  # the running job's 4 GPUs in use


async def test_every_console_page_answers_a_rebuilding_page_while_the_projections_are_lost_then_the_same_page(
    bus: Bus, store: Store, admin_browser: httpx.AsyncClient
) -> None:
    before = {}
    for path in (*PAGES, "/finance/capacity"):
        answer = await admin_browser.get(path)
        assert answer.status_code == 200, f"{path}: {answer.status_code} {answer.text}"
        shows_what_it_should(path, answer.text)
        before[path] = answer.text

    await store.redis.flushall()  # Redis restarted empty; no projector has noticed yet

    for path in (*PAGES, "/finance/capacity"):
        answer = await admin_browser.get(path)
        assert answer.status_code == 503, f"{path}: {answer.status_code} {answer.text}"
        assert answer.headers["Retry-After"] == "1", path
        assert answer.headers["content-type"].startswith("text/html"), path
        assert "being rebuilt" in answer.text and "Cannot show this" in answer.text, path
    jobs_page = await admin_browser.get("/jobs/new")  # a form that reads no projection is still served
    assert jobs_page.status_code == 200
    cancelled = await admin_browser.post("/jobs/run-1/cancel", data={"csrf": csrf_of(jobs_page.text)})
    assert cancelled.status_code == 503 and "being rebuilt" in cancelled.text  # not "no job", and nothing sent

    await project(bus, store, "NODES", "JOBS")
    for path in (*PAGES, "/finance/capacity"):
        answer = await admin_browser.get(path)
        assert answer.status_code == 200, f"{path}: {answer.status_code} {answer.text}"
        shows_what_it_should(path, answer.text)
    assert "run-1" in (await admin_browser.get("/jobs?status=running")).text  # still running: no cancel was sent
