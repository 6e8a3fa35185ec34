"""The REST front door against real NATS and Redis: submissions reach the
intake stream, reads come from the projections, every caller is verified and
tenants stay apart."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from trainyard.bus import Bus
from trainyard.domain import JobSpec, NodeInfo, Role
from trainyard.events import (
    CancelJob,
    JobAccepted,
    JobAdmitted,
    JobPlaced,
    NodeRegistered,
    ReplicaPlacement,
    RunStarted,
    RunSucceeded,
    SubmitJob,
    decode_intake,
    subjects,
)
from trainyard.local.servers import Server, free_port, wait_port
from trainyard.store import Store, waiting
from trainyard.store.waiting import Waiting
from trainyard.testing.auth import Callers
from trainyard.testing.publish import publish_event
from trainyard.testing.streams import project
from trainyard_gateway.jobs import JobOperations
from trainyard_gateway.rest import create_app

# --- builders -------------------------------------------------------------------------------


def spec_body(tenant: str = "acme", **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "tenant": tenant,
        "queue": "default",
        "name": "llama-pretrain",
        "roles": [{"name": "trainer", "replicas": 2, "gpus_per_replica": 8}],
        "simulated_duration_s": 60.0,
    }
    body.update(overrides)
    return body


def spec(tenant: str = "acme", gpus: int = 4) -> JobSpec:
    return JobSpec(
        tenant=tenant, queue="default", roles=[Role(name="trainer", gpus_per_replica=gpus)], simulated_duration_s=1.0
    )


async def record_job(bus: Bus, job_id: str, tenant: str = "acme", until: str = "running") -> None:
    """Publish a job's lifecycle on the JOBS stream up to ``until``."""
    run_id = f"{job_id}-r1"
    events: list[Any] = [JobAccepted(at=1.0, job_id=job_id, spec=spec(tenant), submitted_at=0.5)]
    if until in ("running", "succeeded"):
        placed = [ReplicaPlacement(role="trainer", replica=0, rank=0, node_id="n1", gpus=[0, 1, 2, 3])]
        events += [
            JobAdmitted(at=2.0, job_id=job_id, tenant=tenant, run_id=run_id, attempt=1),
            JobPlaced(at=3.0, job_id=job_id, tenant=tenant, run_id=run_id, cluster="c1", replicas=placed),
            RunStarted(at=4.0, job_id=job_id, tenant=tenant, run_id=run_id),
        ]
    if until == "succeeded":
        events.append(RunSucceeded(at=9.0, job_id=job_id, tenant=tenant, run_id=run_id))
    for i, event in enumerate(events):
        await publish_event(bus, event, msg_id=f"{job_id}:{i}")


async def register_node(bus: Bus, node_id: str = "n1", gpus: int = 8) -> None:
    node = NodeInfo(node_id=node_id, cluster="c1", gpu_type="H100", gpus=gpus)
    await bus.publish(subjects.node("c1", node_id), NodeRegistered(at=0.0, node=node, boot_id="b1"), msg_id=node_id)


async def intake_count(bus: Bus) -> int:
    return (await bus.js.stream_info("INTAKE")).state.messages


async def last_intake(bus: Bus, tenant: str) -> Any:
    msg = await bus.js.get_last_msg("INTAKE", subjects.intake(tenant))
    return decode_intake(msg.data)


def fields(response: httpx.Response) -> list[str]:
    return [e["field"] for e in response.json()["errors"]]


@pytest.fixture
async def client(bus: Bus, store: Store, callers: Callers) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway's app, called as an admin unless a test sends other credentials."""
    app = create_app(JobOperations(bus, store), store, callers.authenticator)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://gateway", headers=callers.headers("admin")
    ) as c:
        yield c


# --- submit ------------------------------------------------------------------------------------


async def test_a_submission_is_published_as_submit_job_on_the_tenants_intake_subject(
    client: httpx.AsyncClient, bus: Bus
) -> None:
    response = await client.post("/v1/jobs", json=spec_body(job_id="run-42"))

    assert response.status_code == 202
    assert response.json() == {"job_id": "run-42", "status": "submitted"}
    command = await last_intake(bus, "acme")
    assert isinstance(command, SubmitJob)
    assert command.job_id == "run-42"
    assert command.spec.name == "llama-pretrain" and command.spec.total_gpus == 16


async def test_a_submission_without_a_job_id_gets_one_and_a_retry_with_the_same_id_is_one_message(
    client: httpx.AsyncClient, bus: Bus
) -> None:
    first = await client.post("/v1/jobs", json=spec_body())
    job_id = first.json()["job_id"]
    assert first.status_code == 202 and job_id.startswith("j-")

    again = await client.post("/v1/jobs", json=spec_body(job_id=job_id))
    assert again.status_code == 202
    assert await intake_count(bus) == 1


@pytest.mark.parametrize(
    ("body", "field"),
    [
        pytest.param({k: v for k, v in spec_body().items() if k != "queue"}, "queue", id="a missing queue is named"),
        pytest.param(
            spec_body(roles=[{"name": "trainer", "replicas": "two"}]),
            "roles[0].replicas",
            id="replicas given as text names the role's replicas",
        ),
        pytest.param(
            spec_body(roles=[{"name": "trainer", "gpus_per_replica": 0}]),
            "roles[0].gpus_per_replica",
            id="zero GPUs per replica names the field",
        ),
        pytest.param(spec_body(topology={"level": "galaxy"}), "topology.level", id="an unknown topology level"),
        pytest.param(
            spec_body(roles=[{"name": "trainer", "gpus_per_replcia": 8}]),
            "roles[0].gpus_per_replcia",
            id="a misspelt key is refused, not ignored",
        ),
        pytest.param(spec_body(simulated_duration_s=None), "image", id="a job that says nothing about what to run"),
        pytest.param(spec_body(job_id="has spaces"), "job_id", id="a job id with spaces"),
        pytest.param(spec_body(tenant="acme.research"), "tenant", id="a tenant that cannot be a subject token"),
        pytest.param("{not json", "body", id="a body that is not JSON"),
        pytest.param([1, 2], "body", id="a body that is not an object"),
    ],
)
async def test_bad_input_is_422_naming_the_field_and_publishes_nothing(
    client: httpx.AsyncClient, bus: Bus, body: Any, field: str
) -> None:
    content = body if isinstance(body, str) else json.dumps(body)
    response = await client.post("/v1/jobs", content=content, headers={"content-type": "application/json"})

    assert response.status_code == 422
    assert response.json()["code"] == "invalid_argument"
    assert field in fields(response)
    assert await intake_count(bus) == 0


# --- read ------------------------------------------------------------------------------------------


async def test_a_projected_job_reads_back_with_its_status_run_and_placement(
    client: httpx.AsyncClient, bus: Bus, store: Store
) -> None:
    await record_job(bus, "j1")
    await project(bus, store, "JOBS")

    response = await client.get("/v1/jobs/j1")

    assert response.status_code == 200
    job = response.json()
    assert (job["status"], job["run_id"], job["attempt"], job["tenant"]) == ("running", "j1-r1", 1, "acme")
    assert job["placement"] == [{"role": "trainer", "replica": 0, "rank": 0, "node_id": "n1", "gpus": [0, 1, 2, 3]}]
    assert job["spec"]["roles"][0]["gpus_per_replica"] == 4


async def test_a_pending_job_says_why_it_waits_and_where_it_is_in_line(
    client: httpx.AsyncClient, bus: Bus, store: Store
) -> None:
    await record_job(bus, "j1", until="pending")
    await project(bus, store, "JOBS")
    await waiting.write(store, "pending", {"j1": Waiting("quota_exhausted", 3)})

    job = (await client.get("/v1/jobs/j1")).json()
    [listed] = (await client.get("/v1/jobs")).json()["jobs"]

    assert (job["status"], job["reason"], job["position"]) == ("pending", "quota_exhausted", 3)
    assert (listed["reason"], listed["position"]) == ("quota_exhausted", 3)


async def test_a_reason_for_a_status_the_job_has_left_is_not_shown(
    client: httpx.AsyncClient, bus: Bus, store: Store
) -> None:
    await record_job(bus, "j1", until="running")
    await project(bus, store, "JOBS")
    # Written by a decider that read the job before it moved on.
    await waiting.write(store, "pending", {"j1": Waiting("quota_exhausted", 3)})
    await waiting.write(store, "admitted", {"j1": Waiting("insufficient_gpus", expected_start=9.0)})

    job = (await client.get("/v1/jobs/j1")).json()

    assert (job["status"], job["reason"], job["position"], job["expected_start"]) == ("running", None, None, None)


async def test_an_unknown_job_is_404_with_a_message_naming_it(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/jobs/nope")

    assert response.status_code == 404
    assert response.json()["code"] == "not_found" and "'nope'" in response.json()["message"]


async def test_listing_filters_by_status_and_rejects_an_unknown_status(
    client: httpx.AsyncClient, bus: Bus, store: Store
) -> None:
    await record_job(bus, "j1", until="running")
    await record_job(bus, "j2", until="pending")
    await project(bus, store, "JOBS")

    running = await client.get("/v1/jobs", params={"status": "running"})
    everything = await client.get("/v1/jobs", params={"limit": 10})
    bad = await client.get("/v1/jobs", params={"status": "sleeping"})

    assert [j["job_id"] for j in running.json()["jobs"]] == ["j1"]
    assert {j["job_id"] for j in everything.json()["jobs"]} == {"j1", "j2"}
    assert bad.status_code == 422 and fields(bad) == ["status"]


async def test_nodes_list_their_state_and_free_gpus(client: httpx.AsyncClient, bus: Bus, store: Store) -> None:
    await register_node(bus)
    await record_job(bus, "j1")
    await project(bus, store, "NODES", "JOBS")

    [node] = (await client.get("/v1/nodes")).json()["nodes"]

    assert (node["node_id"], node["state"], node["free_gpus"]) == ("n1", "healthy", [4, 5, 6, 7])
    assert node["info"]["gpu_type"] == "H100"


# --- cancel --------------------------------------------------------------------------------------------


async def test_cancelling_a_running_job_publishes_cancel_job(client: httpx.AsyncClient, bus: Bus, store: Store) -> None:
    await record_job(bus, "j1")
    await project(bus, store, "JOBS")

    response = await client.delete("/v1/jobs/j1", params={"reason": "wrong dataset"})

    assert response.status_code == 202 and response.json() == {"job_id": "j1", "status": "cancelling"}
    command = await last_intake(bus, "acme")
    assert isinstance(command, CancelJob) and command.reason == "wrong dataset"


async def test_cancelling_a_finished_job_is_409_and_publishes_nothing(
    client: httpx.AsyncClient, bus: Bus, store: Store
) -> None:
    await record_job(bus, "j1", until="succeeded")
    await project(bus, store, "JOBS")

    response = await client.delete("/v1/jobs/j1")

    assert response.status_code == 409
    assert "succeeded" in response.json()["message"]
    assert await intake_count(bus) == 0


# --- tenancy ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        pytest.param("GET", "/v1/jobs/j-other", None, 404, id="reading another tenant's job looks like no job"),
        pytest.param("DELETE", "/v1/jobs/j-other", None, 404, id="cancelling another tenant's job looks like no job"),
        pytest.param("POST", "/v1/jobs", spec_body(tenant="globex"), 403, id="submitting for another tenant"),
        pytest.param("GET", "/v1/jobs?tenant=globex", None, 403, id="listing another tenant's jobs"),
    ],
)
async def test_a_tenant_scoped_caller_cannot_see_or_touch_another_tenants_jobs(
    client: httpx.AsyncClient, callers: Callers, bus: Bus, store: Store, method: str, path: str, body: Any, status: int
) -> None:
    await record_job(bus, "j-other", tenant="globex")
    await project(bus, store, "JOBS")

    response = await client.request(method, path, json=body, headers=callers.headers("acme"))

    assert response.status_code == status
    assert await intake_count(bus) == 0


async def test_a_tenant_scoped_caller_lists_and_reads_only_its_own_jobs(
    client: httpx.AsyncClient, callers: Callers, bus: Bus, store: Store
) -> None:
    await record_job(bus, "j-mine", tenant="acme")
    await record_job(bus, "j-other", tenant="globex")
    await project(bus, store, "JOBS")
    scoped = callers.headers("acme")

    listed = await client.get("/v1/jobs", headers=scoped)
    mine = await client.get("/v1/jobs/j-mine", headers=scoped)

    assert [j["job_id"] for j in listed.json()["jobs"]] == ["j-mine"]
    assert mine.status_code == 200
    assert (await client.post("/v1/jobs", json=spec_body(), headers=scoped)).status_code == 202


# --- usage -------------------------------------------------------------------------------------------------


async def test_usage_is_501_until_accounting_provides_a_source(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/usage", params={"tenant": "acme"})

    assert response.status_code == 501 and "usage" in response.json()["message"]


@pytest.mark.parametrize(
    ("caller", "params", "status", "asked_for"),
    [
        pytest.param("admin", {"tenant": "acme"}, 200, ["acme"], id="an admin reads the tenant it names"),
        pytest.param("acme", {}, 200, ["acme"], id="a researcher reads its own tenant's usage"),
        pytest.param("acme", {"tenant": "globex"}, 403, [], id="a researcher asks for another tenant"),
    ],
)
async def test_usage_comes_from_the_usage_source_for_the_callers_tenant(
    bus: Bus, store: Store, callers: Callers, caller: str, params: dict[str, str], status: int, asked_for: list[str]
) -> None:
    calls: list[str | None] = []

    def usage_source(tenant: str | None) -> list[dict[str, Any]]:
        calls.append(tenant)
        return [{"tenant": tenant, "gpu_type": "H100", "gpu_seconds": 3600.0}]

    app = create_app(JobOperations(bus, store), store, callers.authenticator, usage_source=usage_source)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as c:
        response = await c.get("/v1/usage", params=params, headers=callers.headers(caller))

    assert response.status_code == status
    assert calls == asked_for
    if status == 200:
        assert response.json() == [{"tenant": "acme", "gpu_type": "H100", "gpu_seconds": 3600.0}]


# --- operations ------------------------------------------------------------------------------------------------


async def test_healthz_is_200_when_redis_and_nats_answer(client: httpx.AsyncClient) -> None:
    response = await client.get("/healthz")

    assert response.status_code == 200
    assert response.json() == {"status": "ok", "checks": {"redis": "ok", "nats": "ok"}}


async def test_healthz_is_503_when_redis_is_unreachable(bus: Bus, callers: Callers) -> None:
    unreachable = Store.from_url(f"redis://127.0.0.1:{free_port()}/0")
    app = create_app(JobOperations(bus, unreachable), unreachable, callers.authenticator)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as c:
        response = await c.get("/healthz")
    await unreachable.close()

    assert response.status_code == 503
    assert response.json()["checks"]["nats"] == "ok" and response.json()["checks"]["redis"] != "ok"


async def test_metrics_show_jobs_by_status_gpus_nodes_and_requests(
    client: httpx.AsyncClient, bus: Bus, store: Store
) -> None:
    await register_node(bus)
    await record_job(bus, "j1", until="running")
    await record_job(bus, "j2", until="pending")
    await record_job(bus, "j3", until="succeeded")
    await project(bus, store, "NODES", "JOBS")
    await client.get("/v1/jobs/j1")
    await client.get("/v1/jobs/nope")

    response = await client.get("/metrics")

    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    text = response.text
    for line in [
        'trainyard_jobs{status="running"} 1.0',
        'trainyard_jobs{status="pending"} 1.0',
        'trainyard_jobs{status="succeeded"} 1.0',
        'trainyard_jobs{status="failed"} 0.0',
        'trainyard_gpus_capacity{gpu_type="H100"} 8.0',
        'trainyard_gpus_in_use{gpu_type="H100"} 4.0',
        'trainyard_nodes{state="healthy"} 1.0',
        'trainyard_gateway_http_requests_total{code="200",method="GET",route="/v1/jobs/{job_id}"} 1.0',
        'trainyard_gateway_http_requests_total{code="404",method="GET",route="/v1/jobs/{job_id}"} 1.0',
    ]:
        assert line in text, line


async def test_openapi_is_served_with_the_job_spec_schema(client: httpx.AsyncClient) -> None:
    schema = (await client.get("/openapi.json")).json()

    assert {"/v1/jobs", "/v1/jobs/{job_id}", "/v1/nodes", "/healthz"} <= set(schema["paths"])
    assert "roles" in schema["components"]["schemas"]["SubmitJobBody"]["properties"]
    assert (await client.get("/docs")).status_code == 200


async def test_every_schema_the_openapi_document_names_is_in_it_and_only_healthz_is_public(
    client: httpx.AsyncClient,
) -> None:
    schema = (await client.get("/openapi.json")).json()

    named = set(re.findall(r'"#/components/schemas/(\w+)"', json.dumps(schema)))
    assert {"SubmitJobBody", "JobView", "ErrorBody", "CreateTokenBody", "Role"} <= named
    assert named <= set(schema["components"]["schemas"])
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            guarded = path != "/healthz"
            assert (operation.get("security") == [{"bearer": []}]) == guarded, (method, path)
            assert {"401", "403"} <= set(operation["responses"]) or not guarded, (method, path)


# --- the process ------------------------------------------------------------------------------------------------


async def test_the_gateway_process_serves_rest_and_grpc_and_stops_on_sigterm(
    nats_server: Server, redis_server: Server, redis_prefix: str, callers: Callers
) -> None:
    import grpc

    from trainyard._pb.trainyard.v1 import jobs_pb2, jobs_pb2_grpc

    http_port, grpc_port = free_port(), free_port()
    env = {
        **os.environ,
        "TRAINYARD_NATS_URL": nats_server.url,
        "TRAINYARD_REDIS_URL": redis_server.url,
        "TRAINYARD_REDIS_PREFIX": redis_prefix,
        "TRAINYARD_GATEWAY_HTTP_PORT": str(http_port),
        "TRAINYARD_GATEWAY_GRPC_PORT": str(grpc_port),
    }
    proc = subprocess.Popen([sys.executable, "-m", "trainyard_gateway"], env=env, stderr=subprocess.PIPE)
    try:
        await asyncio.to_thread(wait_port, http_port, 20.0, proc, "gateway")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{http_port}") as c:
            health = await c.get("/healthz")
            anonymous = await c.post("/v1/jobs", json=spec_body(job_id="via-process"))
            submitted = await c.post("/v1/jobs", json=spec_body(job_id="via-process"), headers=callers.headers("acme"))
        async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            stub = jobs_pb2_grpc.JobServiceStub(channel)
            listed = await stub.ListJobs(jobs_pb2.ListJobsRequest(), timeout=10, metadata=callers.metadata("acme"))
        assert health.status_code == 200
        assert anonymous.status_code == 401
        assert submitted.status_code == 202
        assert list(listed.jobs) == []
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _, stderr = await asyncio.to_thread(proc.communicate, timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode == 0, stderr.decode()[-2000:]


# --- input that once stopped the gateway -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "status", "says"),
    [
        pytest.param(
            json.dumps(spec_body(name="x" * 1_048_000)),
            413,
            "at most 262144 bytes",
            id="a body near NATS's 1 MiB limit",
        ),
        pytest.param(
            json.dumps(spec_body())[:-1] + ', "extra": ' + "[" * 150_000 + "]" * 150_000 + "}",
            413,
            "at most",
            id="a deeply nested unknown field past the body limit",
        ),
        pytest.param(
            json.dumps(spec_body())[:-1] + ', "extra": ' + "[" * 5_000 + "]" * 5_000 + "}",
            422,
            "nested too deeply",
            id="a deeply nested unknown field",
        ),
        pytest.param(json.dumps(spec_body(tenant="acme\n")), 422, "tenant", id="a tenant with a trailing newline"),
        pytest.param(
            json.dumps(spec_body(image="i" * 600, simulated_duration_s=None)),
            422,
            "image",
            id="an image name over its cap",
        ),
    ],
)
async def test_oversized_or_odd_bodies_get_a_clear_answer_publish_nothing_and_the_gateway_goes_on(
    client: httpx.AsyncClient, bus: Bus, content: str, status: int, says: str
) -> None:
    response = await client.post("/v1/jobs", content=content, headers={"content-type": "application/json"})

    assert response.status_code == status, response.text[:500]
    assert says in response.text
    assert await intake_count(bus) == 0
    assert (await client.post("/v1/jobs", json=spec_body(job_id="after"))).status_code == 202


async def test_a_retried_submission_is_not_refused_because_redis_holds_only_a_pending_reason_for_it(
    client: httpx.AsyncClient, bus: Bus, store: Store
) -> None:
    # After a wipe, admission may write a pending reason before the projection has folded the job again.
    await waiting.write(store, "pending", {"retried": Waiting("quota_exhausted", 3)})

    response = await client.post("/v1/jobs", json=spec_body(job_id="retried"))
    read = await client.get("/v1/jobs/retried")

    assert response.status_code == 202, response.text
    assert read.status_code == 404  # not a job until the projection folds its acceptance
