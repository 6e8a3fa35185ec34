"""Who may call the REST gateway: every caller is verified from its bearer
credential alone, each role may do what the policy table says and no more,
and every state change is audited under the verified caller."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgspec
import pytest

from trainyard.bus import Bus, ensure_streams
from trainyard.bus.audit import AuditRecord
from trainyard.domain import JobSpec, Role
from trainyard.events import JobAccepted, decode_intake, subjects
from trainyard.settings import Settings
from trainyard.store import Store
from trainyard.testing.auth import Callers
from trainyard.testing.publish import publish_event
from trainyard.testing.streams import project
from trainyard_gateway import finance_api, nodes_api
from trainyard_gateway.jobs import JobOperations
from trainyard_gateway.rest import create_app


def body(tenant: str = "acme", **overrides: Any) -> dict[str, Any]:
    return {
        "tenant": tenant,
        "queue": "default",
        "roles": [{"name": "trainer", "gpus_per_replica": 8}],
        "simulated_duration_s": 60.0,
        **overrides,
    }


@pytest.fixture
async def gateway(bus: Bus, store: Store, callers: Callers) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway's app with no default credentials: each test says who calls."""
    routers = [module.build_router(bus, store, Settings()) for module in (nodes_api, finance_api)]
    app = create_app(JobOperations(bus, store), store, callers.authenticator, routers=routers)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as c:
        yield c


async def intake_count(bus: Bus) -> int:
    return (await bus.js.stream_info("INTAKE")).state.messages


async def audit_records(bus: Bus) -> list[AuditRecord]:
    info = await bus.js.stream_info("AUDIT")
    records = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        msg = await bus.js.get_msg("AUDIT", seq)
        records.append(msgspec.json.decode(msg.data, type=AuditRecord))
    return records


async def accepted_job(bus: Bus, store: Store, job_id: str, tenant: str) -> None:
    spec = JobSpec(tenant=tenant, queue="default", roles=[Role(name="t", gpus_per_replica=8)], simulated_duration_s=60)
    await publish_event(bus, JobAccepted(at=1.0, job_id=job_id, spec=spec, submitted_at=0.5), msg_id=f"{job_id}:a")
    await project(bus, store, "JOBS")


# --- no identity, no access ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("authorization", "says"),
    [
        pytest.param(None, "no credentials", id="no Authorization header"),
        pytest.param("Basic YWRtaW46YWRtaW4=", "scheme is not accepted", id="another scheme"),
        pytest.param("Bearer ", "is empty", id="an empty bearer credential"),
        pytest.param("Bearer ty_0123456789abcdef_wrong", "malformed API token", id="a token cut short"),
        pytest.param(f"Bearer ty_0123456789abcdef_{'x' * 43}", "unknown API token", id="a token nobody issued"),
        pytest.param("Bearer eyJhbGciOiJIUzI1NiJ9.e30.x", "no JWT issuer", id="a JWT with no issuer configured"),
    ],
)
async def test_a_request_without_verified_credentials_is_401_and_changes_nothing(
    gateway: httpx.AsyncClient, bus: Bus, authorization: str | None, says: str
) -> None:
    headers = {"Authorization": authorization} if authorization is not None else {}
    headers |= {"X-Trainyard-Role": "admin", "X-Trainyard-Operator": "root"}  # claims that grant nothing

    submitted = await gateway.post("/v1/jobs", json=body(), headers=headers)
    listed = await gateway.get("/v1/jobs", headers=headers)
    cordoned = await gateway.post("/v1/nodes/n1/cordon", json={"reason": "x"}, headers=headers)

    for response in (submitted, listed, cordoned):
        assert response.status_code == 401, response.text
        assert response.headers["www-authenticate"].startswith('Bearer realm="trainyard"')
        assert response.json()["code"] == "unauthenticated" and says in response.json()["message"]
    assert await intake_count(bus) == 0


async def test_the_health_check_and_the_api_description_need_no_credentials(gateway: httpx.AsyncClient) -> None:
    assert (await gateway.get("/healthz")).status_code == 200
    schema = (await gateway.get("/openapi.json")).json()
    assert schema["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert "401" in schema["paths"]["/v1/jobs"]["post"]["responses"]


async def test_a_revoked_token_stops_working_at_once_on_this_gateway(
    gateway: httpx.AsyncClient, callers: Callers
) -> None:
    assert (await gateway.get("/v1/jobs", headers=callers.headers("acme"))).status_code == 200

    await callers.store.revoke(callers.ids["acme"], revoked_by="test")
    refused = await gateway.get("/v1/jobs", headers=callers.headers("acme"))

    assert refused.status_code == 401 and "revoked" in refused.json()["message"]


# --- roles ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("caller", "method", "path", "json", "status"),
    [
        pytest.param("finance", "POST", "/v1/jobs", body(), 403, id="finance may not submit"),
        pytest.param("operator", "POST", "/v1/jobs", body(), 403, id="an operator may not submit for a tenant"),
        pytest.param("acme", "POST", "/v1/nodes/n1/cordon", {"reason": "x"}, 403, id="a researcher may not cordon"),
        pytest.param(
            "acme",
            "GET",
            "/v1/exports/chargeback?period=2026-11",
            None,
            403,
            id="a researcher may not export chargeback",
        ),
        pytest.param("acme", "GET", "/v1/auth/tokens", None, 403, id="a researcher may not manage tokens"),
        pytest.param(
            "acme", "POST", "/v1/jobs", body(tenant="globex"), 403, id="a researcher submits only for its tenant"
        ),
        pytest.param("acme", "POST", "/v1/jobs", body(), 202, id="a researcher submits for its tenant"),
    ],
)
async def test_each_role_may_do_what_the_policy_says_and_a_refusal_names_the_roles_that_may(
    gateway: httpx.AsyncClient, callers: Callers, bus: Bus, caller: str, method: str, path: str, json: Any, status: int
) -> None:
    response = await gateway.request(method, path, json=json, headers=callers.headers(caller))

    assert response.status_code == status, response.text
    if status == 403:
        assert response.json()["code"] == "permission_denied"
        assert callers.actor(caller) in response.json()["message"]
        assert await intake_count(bus) == 0


async def test_client_sent_role_and_tenant_headers_are_ignored(
    gateway: httpx.AsyncClient, callers: Callers, bus: Bus, store: Store
) -> None:
    await accepted_job(bus, store, "theirs", tenant="globex")
    await accepted_job(bus, store, "mine", tenant="acme")
    claims = {**callers.headers("acme"), "X-Trainyard-Role": "admin", "X-Trainyard-Tenant": "globex"}

    listed = await gateway.get("/v1/jobs", headers=claims)
    theirs = await gateway.get("/v1/jobs/theirs", headers=claims)
    cancel = await gateway.delete("/v1/jobs/theirs", headers=claims)

    assert [j["job_id"] for j in listed.json()["jobs"]] == ["mine"]
    assert theirs.status_code == 404 and cancel.status_code == 404
    assert await intake_count(bus) == 0


async def test_submits_and_cancels_are_audited_under_the_verified_caller(
    gateway: httpx.AsyncClient, callers: Callers, bus: Bus, store: Store
) -> None:
    submitted = await gateway.post("/v1/jobs", json=body(job_id="audited"), headers=callers.headers("acme"))
    await accepted_job(bus, store, "running-one", tenant="acme")
    cancelled = await gateway.delete("/v1/jobs/running-one", headers=callers.headers("operator"))

    assert (submitted.status_code, cancelled.status_code) == (202, 202)
    records = {(r.action, r.target): r.actor for r in await audit_records(bus)}
    assert records[("job.submit", "audited")] == callers.actor("acme")
    assert records[("job.cancel", "running-one")] == callers.actor("operator")
    command = decode_intake((await bus.js.get_last_msg("INTAKE", subjects.intake("acme"))).data)
    assert command.job_id == "running-one"


async def test_a_submission_whose_audit_record_cannot_be_stored_fails_and_a_retry_stores_each_once(
    gateway: httpx.AsyncClient, callers: Callers, bus: Bus
) -> None:
    # The command and its audit record go out together: the call succeeds only when both are stored.
    await bus.js.delete_stream("AUDIT")
    failed = await gateway.post("/v1/jobs", json=body(job_id="twice"), headers=callers.headers("acme"))
    assert failed.status_code == 503, failed.text
    assert await intake_count(bus) == 1  # the command was stored; the caller was told to try again

    await ensure_streams(bus.js)
    retried = await gateway.post("/v1/jobs", json=body(job_id="twice"), headers=callers.headers("acme"))

    assert retried.status_code == 202, retried.text
    assert await intake_count(bus) == 1  # the retry is the same command (its message id)
    records = [(r.action, r.target, r.actor) for r in await audit_records(bus)]
    assert records == [("job.submit", "twice", callers.actor("acme"))]


# --- tokens ------------------------------------------------------------------------------------------------


async def test_an_admin_creates_a_token_that_works_and_revokes_it(gateway: httpx.AsyncClient, callers: Callers) -> None:
    created = await gateway.post(
        "/v1/auth/tokens",
        json={"name": "alice", "role": "researcher", "tenant": "acme"},
        headers=callers.headers("admin"),
    )
    assert created.status_code == 201, created.text
    token, token_id = created.json()["token"], created.json()["info"]["id"]
    alice = {"Authorization": f"Bearer {token}"}

    assert (await gateway.get("/v1/jobs", headers=alice)).status_code == 200
    listed = (await gateway.get("/v1/auth/tokens", headers=callers.headers("admin"))).json()["tokens"]
    assert token_id in {t["id"] for t in listed} and all("secret" not in str(t) for t in listed)
    revoked = await gateway.delete(f"/v1/auth/tokens/{token_id}", headers=callers.headers("admin"))
    assert revoked.status_code == 200 and revoked.json()["revoked"] is True
    assert (await gateway.get("/v1/jobs", headers=alice)).status_code == 401


@pytest.mark.parametrize(
    ("request_body", "status", "field_or_words"),
    [
        pytest.param({"name": "bob", "role": "researcher"}, 201, None, id="a researcher of its own tenant"),
        pytest.param({"name": "bob", "role": "operator"}, 403, "may create only", id="not an operator"),
        pytest.param(
            {"name": "bob", "role": "researcher", "tenant": "globex"},
            403,
            "only for tenant",
            id="not for another tenant",
        ),
        pytest.param({"name": "bob", "role": "wizard"}, 422, "role", id="an unknown role is named"),
        pytest.param({"name": "bad name!", "role": "researcher"}, 422, "name", id="a bad name is named"),
    ],
)
async def test_a_tenant_admin_hands_out_tokens_only_inside_its_tenant(
    gateway: httpx.AsyncClient, callers: Callers, request_body: dict[str, Any], status: int, field_or_words: str | None
) -> None:
    response = await gateway.post("/v1/auth/tokens", json=request_body, headers=callers.headers("acme-admin"))

    assert response.status_code == status, response.text
    if status == 201:
        assert response.json()["info"]["tenant"] == "acme"
    elif status == 403:
        assert field_or_words in response.json()["message"]
    else:
        assert field_or_words in [e["field"] for e in response.json()["errors"]]


def test_a_routes_permission_check_runs_on_the_event_loop_not_in_a_worker_thread() -> None:
    import inspect

    from trainyard.auth import Action
    from trainyard_gateway.security import allow

    assert inspect.iscoroutinefunction(allow(Action.JOB_SUBMIT).dependency)
