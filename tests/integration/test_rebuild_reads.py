"""After Redis loses the projection (FLUSHALL under load), every read the
gateway serves while it is rebuilt is the job's right state or a 503 with
Retry-After: never a 404, never an older state; /metrics never shows the
job counts of a half-rebuilt view."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

import grpc
import httpx
import msgspec
import pytest
from test_projection import lifecycle, spec

from trainyard._pb.trainyard.v1 import jobs_pb2 as pb
from trainyard._pb.trainyard.v1 import jobs_pb2_grpc as pb_grpc
from trainyard.bus import Bus
from trainyard.domain import NodeInfo
from trainyard.events import JobAccepted, NodeRegistered, RunSucceeded, subjects
from trainyard.local.servers import free_port
from trainyard.store import Projector, Store, views
from trainyard.store.caught_up import CaughtUpReads, ProjectionRebuilding
from trainyard.testing.auth import Callers
from trainyard.testing.publish import publish_event
from trainyard.testing.streams import project
from trainyard_gateway.grpc_server import start_grpc
from trainyard_gateway.jobs import JobOperations
from trainyard_gateway.metrics import GatewayMetrics
from trainyard_gateway.rest import create_app

JOBS = 150
SUCCEEDED = len(range(0, JOBS, 3))


async def publish_jobs(bus: Bus) -> None:
    """JOBS jobs: every third succeeded, the rest running."""
    for i in range(JOBS):
        await lifecycle(bus, f"j{i}", f"j{i}-r1", "n1", [i % 8])
        if i % 3 == 0:
            await publish_event(
                bus, RunSucceeded(at=9.0, job_id=f"j{i}", tenant="acme", run_id=f"j{i}-r1"), msg_id=f"j{i}:done"
            )


async def keep_submitting(bus: Bus, stop: asyncio.Event) -> None:
    """Load: new jobs accepted while the projection is rebuilt."""
    n = 0
    while not stop.is_set():
        await publish_event(bus, JobAccepted(at=1.0, job_id=f"new{n}", spec=spec(), submitted_at=0.5), msg_id=f"new{n}")
        n += 1
        await asyncio.sleep(0.005)


@pytest.fixture
async def projecting(bus: Bus, store: Store) -> AsyncIterator[Projector]:
    """A JOBS projector running, as admission's does."""
    projector = Projector(bus, store, "JOBS")
    stop = asyncio.Event()
    task = asyncio.create_task(projector.run(stop))
    yield projector
    stop.set()
    await task


@pytest.fixture
async def gateway(bus: Bus, store: Store, callers: Callers) -> AsyncIterator[httpx.AsyncClient]:
    ops = JobOperations(bus, store)
    ops.caught_up.wait_s = ops.nodes_caught_up.wait_s = 0.05  # answer 503 at once, not after the rebuild
    metrics = GatewayMetrics(caught_up=CaughtUpReads(bus, store, wait_s=0.05))
    app = create_app(ops, store, callers.authenticator, metrics=metrics)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://gateway", headers=callers.headers("admin")
    ) as client:
        yield client


def succeeded_gauge(text: str) -> int:
    found = re.search(r'^trainyard_jobs\{status="succeeded"\} ([0-9.e+]+)$', text, re.M)
    assert found, text
    return int(float(found.group(1)))


async def test_reads_during_a_rebuild_after_a_flush_are_right_or_503_never_404_or_older(
    bus: Bus, store: Store, projecting: Projector, gateway: httpx.AsyncClient
) -> None:
    await publish_jobs(bus)
    await projecting.caught_up(timeout=60)
    truth = {}
    for i in range(JOBS):
        response = await gateway.get(f"/v1/jobs/j{i}")
        assert response.status_code == 200, response.text
        truth[f"j{i}"] = response.json()["status"]
    assert set(truth.values()) == {"running", "succeeded"}
    metrics = await gateway.get("/metrics")
    assert succeeded_gauge(metrics.text) == SUCCEEDED

    stop = asyncio.Event()
    load = asyncio.create_task(keep_submitting(bus, stop))
    try:
        await store.redis.flushall()
        answers: dict[int, int] = {}
        settled = False
        while not settled:
            settled = True
            for job_id, status in truth.items():
                response = await gateway.get(f"/v1/jobs/{job_id}")
                answers[response.status_code] = answers.get(response.status_code, 0) + 1
                if response.status_code == 503:
                    assert response.headers["Retry-After"] == "1"
                    assert response.json()["code"] == "rebuilding"
                    settled = False
                    continue
                assert response.status_code == 200, f"{job_id}: {response.status_code} {response.text}"
                assert response.json()["status"] == status, f"{job_id} read in an older state"
            scrape = await gateway.get("/metrics")
            assert scrape.status_code == 200 and succeeded_gauge(scrape.text) == SUCCEEDED
            listed = await gateway.get("/v1/jobs", params={"status": "succeeded", "limit": 1000})
            assert listed.status_code in (200, 503)
            if listed.status_code == 200:
                assert len(listed.json()["jobs"]) == SUCCEEDED
    finally:
        stop.set()
        await load
    assert set(answers) <= {200, 503}, answers  # 503s: as many as the rebuild took (a fast one, none)
    assert projecting.lost_count >= 1


async def test_a_wiped_projection_nobody_rebuilds_yet_answers_rebuilding_on_rest_and_grpc_never_not_found(
    bus: Bus, store: Store, callers: Callers, gateway: httpx.AsyncClient
) -> None:
    await publish_jobs(bus)
    await project(bus, store, "JOBS")
    assert (await gateway.get("/v1/jobs/j3")).json()["status"] == "succeeded"
    assert "trainyard_projection_rebuilding 0.0" in (await gateway.get("/metrics")).text
    await store.redis.flushall()  # Redis restarted empty; no projector has noticed yet

    scrape = await gateway.get("/metrics")  # the last caught-up counts, marked as such
    assert scrape.status_code == 200 and "trainyard_projection_rebuilding 1.0" in scrape.text
    assert succeeded_gauge(scrape.text) == SUCCEEDED
    fresh = GatewayMetrics(caught_up=CaughtUpReads(bus, store, wait_s=0.05))  # no caught-up scrape to show yet
    with pytest.raises(ProjectionRebuilding):
        await fresh.render(store)

    got = await gateway.get("/v1/jobs/j3")
    assert got.status_code == 503 and got.headers["Retry-After"] == "1", got.text
    assert "being rebuilt" in got.json()["message"]
    assert (await gateway.get("/v1/jobs")).status_code == 503
    # The id check of a submission: another tenant's id is neither taken over nor told 202.
    body = {**msgspec.to_builtins(spec()), "tenant": "beta", "job_id": "j3"}
    assert (await gateway.post("/v1/jobs", json=body)).status_code == 503
    assert (await gateway.delete("/v1/jobs/j3")).status_code == 503

    ops = JobOperations(bus, store)
    ops.caught_up.wait_s = 0.05
    port = free_port()
    server = await start_grpc(ops, callers.authenticator, "127.0.0.1", port, GatewayMetrics())
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.JobServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.GetJob(pb.GetJobRequest(job_id="j3"), timeout=10, metadata=callers.metadata("admin"))
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "being rebuilt" in (refused.value.details() or "")
    finally:
        await server.stop(0)

    await project(bus, store, "JOBS")  # rebuilt: the same answers as before the wipe
    assert (await gateway.get("/v1/jobs/j3")).json()["status"] == "succeeded"


async def test_the_node_list_of_a_wiped_projection_answers_rebuilding_not_an_empty_fleet(
    bus: Bus, store: Store, gateway: httpx.AsyncClient
) -> None:
    node = NodeInfo(node_id="n1", cluster="c1", gpu_type="H100", gpus=8)
    await bus.publish(subjects.node("c1", "n1"), NodeRegistered(at=0.0, node=node, boot_id="b1"), msg_id="reg-n1")
    await project(bus, store, "NODES")
    assert [n["node_id"] for n in (await gateway.get("/v1/nodes")).json()["nodes"]] == ["n1"]
    await store.redis.flushall()
    wiped = await gateway.get("/v1/nodes")
    assert wiped.status_code == 503 and wiped.headers["Retry-After"] == "1", wiped.text
    await project(bus, store, "NODES")
    assert [n["node_id"] for n in (await gateway.get("/v1/nodes")).json()["nodes"]] == ["n1"]


async def test_concurrent_reads_share_one_look_up_of_the_stream_head(
    bus: Bus, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    await publish_jobs(bus)
    await project(bus, store, "JOBS")
    look_ups = 0
    stream_info = bus.js.stream_info

    async def counted(*args: object, **kwargs: object) -> object:
        nonlocal look_ups
        look_ups += 1
        return await stream_info(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(bus.js, "stream_info", counted)
    reads = CaughtUpReads(bus, store)
    jobs = await asyncio.gather(*(reads.read(lambda i=i: views.get_job(store, f"j{i}")) for i in range(16)))
    assert [j.job_id for j in jobs if j is not None] == [f"j{i}" for i in range(16)]
    assert look_ups == 1
