"""POST /v1/jobs is served by a plain Starlette route ahead of FastAPI's,
which stays only to document it: the OpenAPI document must not change."""

from __future__ import annotations

import httpx
import msgspec
from fastapi.routing import APIRoute
from starlette.routing import Match

from trainyard.bus import Bus
from trainyard.store import Store
from trainyard.testing.auth import Callers
from trainyard_gateway.jobs import JobOperations
from trainyard_gateway.rest import create_app


def submission_scope(method: str) -> dict[str, object]:
    return {"type": "http", "method": method, "path": "/v1/jobs", "root_path": "", "headers": []}


async def test_the_openapi_document_is_byte_identical_with_and_without_the_lean_submit_route(
    bus: Bus, store: Store, callers: Callers
) -> None:
    app = create_app(JobOperations(bus, store), store, callers.authenticator)
    lean = app.router.routes[0]
    assert not isinstance(lean, APIRoute) and lean.matches(submission_scope("POST"))[0] is Match.FULL
    with_lean = msgspec.json.encode(app.openapi())
    app.router.routes.remove(lean)
    app.openapi_schema = None
    assert msgspec.json.encode(app.openapi()) == with_lean


async def test_a_submission_is_counted_under_its_route_and_listing_still_reaches_fastapi(
    bus: Bus, store: Store, callers: Callers
) -> None:
    app = create_app(JobOperations(bus, store), store, callers.authenticator)
    assert app.router.routes[0].matches(submission_scope("GET"))[0] is Match.PARTIAL
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://gateway", headers=callers.headers("admin")
    ) as client:
        body = {
            "job_id": "lean-1",
            "tenant": "acme",
            "queue": "default",
            "roles": [{"name": "trainer", "gpus_per_replica": 1}],
            "simulated_duration_s": 1.0,
        }
        assert (await client.post("/v1/jobs", json=body)).status_code == 202
        assert (await client.get("/v1/jobs")).status_code == 200
        metrics = (await client.get("/metrics")).text
    assert 'trainyard_gateway_http_requests_total{code="202",method="POST",route="/v1/jobs"} 1.0' in metrics
