"""Job lists page with opaque cursors, on real NATS and Redis: a walk of
2,100 jobs in pages of 100 returns every job exactly once, also while new jobs
are accepted and folded between pages; filters by status, tenant and
submission time page the same way; a damaged cursor, or one given for other
filters or another tenant, is a 400 that says what to send."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from trainyard.bus import Bus
from trainyard.store import Store
from trainyard.store.job_pages import JobQuery, page_jobs
from trainyard.testing import job_seeding as seeding
from trainyard.testing.auth import Callers
from trainyard_gateway.jobs import JobOperations
from trainyard_gateway.rest import create_app

JOBS = 2_100


@pytest.fixture
async def seeded(bus: Bus, store: Store) -> AsyncIterator[seeding.Projector]:
    """:data:`JOBS` jobs folded, and the JOBS projector still running (new jobs keep being folded)."""
    projector, stop, task = seeding.run_projector(bus, store)
    await seeding.publish_jobs(bus, 0, JOBS)
    await seeding.fold_all(bus, store, projector)
    yield projector
    stop.set()
    await task


@pytest.fixture
async def api(bus: Bus, store: Store, callers: Callers) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(JobOperations(bus, store), store, callers.authenticator)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as client:
        yield client


def expected(keep: Any = lambda i: True) -> list[str]:
    """The ids of the seeded jobs ``keep`` keeps, newest first."""
    return [seeding.job_id(i) for i in reversed(range(JOBS)) if keep(i)]


async def walk(api: httpx.AsyncClient, caller: str, callers: Callers, **params: Any) -> tuple[list[str], int]:
    """Every job id a walk of ``GET /v1/jobs`` returns, page after page, and how many pages it took."""
    ids: list[str] = []
    pages = 0
    cursor = None
    while True:
        answer = await api.get("/v1/jobs", params={**params, "cursor": cursor}, headers=callers.headers(caller))
        assert answer.status_code == 200, answer.text
        ids += [j["job_id"] for j in answer.json()["jobs"]]
        pages += 1
        cursor = answer.json()["next_cursor"]
        if cursor is None:
            return ids, pages


async def test_a_walk_in_pages_of_100_returns_every_job_once_while_new_jobs_keep_arriving(
    seeded: seeding.Projector, api: httpx.AsyncClient, bus: Bus, store: Store, callers: Callers
) -> None:
    ids: list[str] = []
    cursor = None
    arrived = JOBS
    while True:
        params = {"limit": 100, **({"cursor": cursor} if cursor else {})}
        answer = (await api.get("/v1/jobs", params=params, headers=callers.headers("admin"))).json()
        ids += [j["job_id"] for j in answer["jobs"]]
        await seeding.publish_jobs(bus, arrived, 5)  # newer jobs, folded while the walk goes on
        arrived += 5
        cursor = answer["next_cursor"]
        if cursor is None:
            break

    assert ids == expected()  # each once, newest first: the newer arrivals do not shift the walk
    await seeding.fold_all(bus, store, seeded)
    newest = (await api.get("/v1/jobs", params={"limit": 5}, headers=callers.headers("admin"))).json()
    assert [j["job_id"] for j in newest["jobs"]] == [seeding.job_id(i) for i in reversed(range(arrived - 5, arrived))]


async def test_an_oldest_first_walk_reaches_the_jobs_accepted_during_it_once_each(
    seeded: seeding.Projector, bus: Bus, store: Store
) -> None:
    query = JobQuery(tenant="acme", newest_first=False)
    ids: list[str] = []
    after = None
    arrived = JOBS
    while True:
        page = await page_jobs(store, query, 100, after)
        ids += [j.job_id for j in page.jobs]
        if arrived < JOBS + 40:
            await seeding.publish_jobs(bus, arrived, 10)
            arrived += 10
            await seeding.fold_all(bus, store, seeded)
        if page.next is None:
            break
        after = page.next

    acme = [seeding.job_id(i) for i in range(arrived) if seeding.tenant_of(i) == "acme"]
    assert ids == acme


@pytest.mark.parametrize(
    ("params", "keep"),
    [
        pytest.param({"status": "cancelled"}, lambda i: i % 3 == 0, id="status"),
        pytest.param({"tenant": "globex"}, lambda i: i % 2 == 1, id="tenant"),
        pytest.param({"tenant": "acme", "status": "pending"}, lambda i: i % 2 == 0 and i % 3 != 0, id="both"),
        pytest.param(
            {"submitted_after": seeding.SUBMITTED_AT + 300, "submitted_before": seeding.SUBMITTED_AT + 1_750},
            lambda i: 300 <= i < 1_750,
            id="time",
        ),
        pytest.param(
            {"submitted_before": "1970-01-12T13:46:45Z", "status": "cancelled"},  # SUBMITTED_AT + 5
            lambda i: i < 5 and i % 3 == 0,
            id="time as ISO 8601 and status",
        ),
    ],
)
async def test_filters_page_the_same_way(
    seeded: seeding.Projector, api: httpx.AsyncClient, callers: Callers, params: dict[str, Any], keep: Any
) -> None:
    ids, pages = await walk(api, "admin", callers, limit=100, **params)

    assert ids == expected(keep)
    assert pages >= len(ids) // 100


async def test_a_tenant_scoped_caller_walks_only_its_tenant_and_cannot_use_another_tenant_s_cursor(
    seeded: seeding.Projector, api: httpx.AsyncClient, callers: Callers
) -> None:
    ids, _ = await walk(api, "acme", callers, limit=250)
    globex = (await api.get("/v1/jobs", params={"limit": 10}, headers=callers.headers("globex"))).json()
    everyone = (await api.get("/v1/jobs", params={"limit": 10}, headers=callers.headers("admin"))).json()

    for cursor in (globex["next_cursor"], everyone["next_cursor"]):
        refused = await api.get("/v1/jobs", params={"cursor": cursor}, headers=callers.headers("acme"))
        assert refused.status_code == 400, refused.text
        assert refused.json()["code"] == "invalid_cursor" and refused.json()["errors"][0]["field"] == "cursor"
        assert "other filters (or another tenant)" in refused.json()["message"]
    assert ids == expected(lambda i: seeding.tenant_of(i) == "acme")


@pytest.mark.parametrize(
    "cursor",
    [
        pytest.param("not-a-cursor", id="not base64 JSON"),
        pytest.param("eyJvZiI6ImpvYnMifQ", id="JSON without a position"),
        pytest.param("x" * 2_000, id="far too long"),
    ],
)
async def test_a_damaged_cursor_is_a_400_saying_to_pass_next_cursor_unchanged(
    seeded: seeding.Projector, api: httpx.AsyncClient, callers: Callers, cursor: str
) -> None:
    answer = await api.get("/v1/jobs", params={"cursor": cursor}, headers=callers.headers("admin"))

    assert answer.status_code == 400
    body = answer.json()
    assert body["code"] == "invalid_cursor" and body["errors"][0]["field"] == "cursor"
    assert "pass next_cursor from the previous page unchanged" in body["errors"][0]["message"]


async def test_a_cursor_sent_with_other_filters_is_refused_and_a_good_one_still_works(
    seeded: seeding.Projector, api: httpx.AsyncClient, callers: Callers
) -> None:
    admin = callers.headers("admin")
    first = (await api.get("/v1/jobs", params={"status": "cancelled", "limit": 3}, headers=admin)).json()

    other = await api.get("/v1/jobs", params={"status": "pending", "cursor": first["next_cursor"]}, headers=admin)
    same = await api.get("/v1/jobs", params={"status": "cancelled", "cursor": first["next_cursor"]}, headers=admin)

    assert other.status_code == 400 and "send the same filters (status)" in other.json()["errors"][0]["message"]
    assert [j["job_id"] for j in first["jobs"] + same.json()["jobs"]][:6] == expected(lambda i: i % 3 == 0)[:6]


async def test_time_bounds_that_are_not_times_or_are_backwards_are_refused(
    seeded: seeding.Projector, api: httpx.AsyncClient, callers: Callers
) -> None:
    admin = callers.headers("admin")
    garbled = await api.get("/v1/jobs", params={"submitted_after": "yesterday"}, headers=admin)
    backwards = await api.get(
        "/v1/jobs", params={"submitted_after": "2026-02-01", "submitted_before": "2026-01-01"}, headers=admin
    )

    assert garbled.status_code == 422 and garbled.json()["errors"][0]["field"] == "submitted_after"
    assert backwards.status_code == 422 and backwards.json()["errors"][0] == {
        "field": "submitted_before",
        "message": "must be later than submitted_after",
    }
