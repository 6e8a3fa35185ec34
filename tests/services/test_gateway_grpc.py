"""The gRPC front door against real NATS and Redis: the same operations, the
same verified callers and the same tenancy as REST, failures as gRPC status
codes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from trainyard._pb.trainyard.v1 import jobs_pb2 as pb
from trainyard._pb.trainyard.v1 import jobs_pb2_grpc as pb_grpc
from trainyard.bus import Bus
from trainyard.domain import JobSpec, Role, TopologyConstraint, TopologyLevel
from trainyard.events import (
    CancelJob,
    JobAccepted,
    JobAdmitted,
    JobPlaced,
    ReplicaPlacement,
    RunStarted,
    RunSucceeded,
    SubmitJob,
    decode_intake,
    subjects,
)
from trainyard.local.servers import free_port
from trainyard.store import Store
from trainyard.testing.auth import Callers
from trainyard.testing.publish import publish_event
from trainyard.testing.streams import project
from trainyard_gateway.grpc_server import FIELD_ERRORS_METADATA, spec_from_proto, spec_to_proto, start_grpc
from trainyard_gateway.jobs import JobOperations
from trainyard_gateway.metrics import GatewayMetrics

ACME = "acme"  # a researcher of tenant acme (trainyard.testing.auth.CALLERS)


class DefaultCaller(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """Calls that carry no credentials of their own go as ``metadata``'s caller."""

    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.metadata = metadata

    async def intercept_unary_unary(self, continuation, details, request):  # type: ignore[no-untyped-def]
        if not details.metadata:
            details = details._replace(metadata=grpc.aio.Metadata(*self.metadata))
        return await continuation(details, request)


def proto_spec(tenant: str = "acme", **overrides: Any) -> pb.JobSpec:
    fields: dict[str, Any] = {
        "tenant": tenant,
        "queue": "default",
        "name": "llama-pretrain",
        "roles": [pb.Role(name="trainer", replicas=2, gpus_per_replica=8)],
        "simulated_duration_s": 60.0,
    }
    fields.update(overrides)
    return pb.JobSpec(**{k: v for k, v in fields.items() if v is not None})


def spec(tenant: str = "acme") -> JobSpec:
    return JobSpec(
        tenant=tenant, queue="default", roles=[Role(name="trainer", gpus_per_replica=4)], simulated_duration_s=1.0
    )


async def record_job(bus: Bus, job_id: str, tenant: str = "acme", until: str = "running") -> None:
    run_id = f"{job_id}-r1"
    placed = [ReplicaPlacement(role="trainer", replica=0, rank=0, node_id="n1", gpus=[0, 1, 2, 3])]
    events: list[Any] = [
        JobAccepted(at=1.0, job_id=job_id, spec=spec(tenant), submitted_at=0.5),
        JobAdmitted(at=2.0, job_id=job_id, tenant=tenant, run_id=run_id, attempt=1),
        JobPlaced(at=3.0, job_id=job_id, tenant=tenant, run_id=run_id, cluster="c1", replicas=placed),
        RunStarted(at=4.0, job_id=job_id, tenant=tenant, run_id=run_id),
    ]
    if until == "succeeded":
        events.append(RunSucceeded(at=9.0, job_id=job_id, tenant=tenant, run_id=run_id))
    for i, event in enumerate(events):
        await publish_event(bus, event, msg_id=f"{job_id}:{i}")


async def intake_count(bus: Bus) -> int:
    return (await bus.js.stream_info("INTAKE")).state.messages


@pytest.fixture
def metrics() -> GatewayMetrics:
    return GatewayMetrics()


@pytest.fixture
async def server(bus: Bus, store: Store, callers: Callers, metrics: GatewayMetrics) -> AsyncIterator[int]:
    """The gRPC server's port."""
    port = free_port()
    server = await start_grpc(JobOperations(bus, store), callers.authenticator, "127.0.0.1", port, metrics)
    yield port
    await server.stop(0)


@pytest.fixture
async def stub(server: int, callers: Callers) -> AsyncIterator[pb_grpc.JobServiceStub]:
    """A stub that calls as an admin unless a call sends its own credentials."""
    interceptors = [DefaultCaller(callers.metadata("admin"))]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server}", interceptors=interceptors) as channel:
        yield pb_grpc.JobServiceStub(channel)


# --- submit ---------------------------------------------------------------------------------------------


async def test_submit_job_publishes_submit_job_with_the_spec_defaults_for_unset_fields(
    stub: pb_grpc.JobServiceStub, bus: Bus
) -> None:
    request = pb.SubmitJobRequest(spec=proto_spec(roles=[pb.Role(name="trainer")]), job_id="run-7")

    response = await stub.SubmitJob(request, timeout=10)

    assert (response.job_id, response.status) == ("run-7", "submitted")
    command = decode_intake((await bus.js.get_last_msg("INTAKE", subjects.intake("acme"))).data)
    assert isinstance(command, SubmitJob) and command.job_id == "run-7"
    [role] = command.spec.roles
    assert (role.replicas, role.gpus_per_replica, role.gpu_type, command.spec.priority_class) == (
        1,
        1,
        "H100",
        "standard",
    )


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        pytest.param(pb.SubmitJobRequest(spec=proto_spec(roles=[])), "roles", id="a job with no roles"),
        pytest.param(
            pb.SubmitJobRequest(spec=proto_spec(roles=[pb.Role(name="trainer", replicas=0)])),
            "roles[0].replicas",
            id="replicas explicitly zero is not taken as the default",
        ),
        pytest.param(
            pb.SubmitJobRequest(spec=proto_spec(topology=pb.TopologyConstraint(required=True))),
            "topology.level",
            id="a topology constraint without a level",
        ),
        pytest.param(
            pb.SubmitJobRequest(spec=proto_spec(simulated_duration_s=None)),
            "image",
            id="a job that says nothing about what to run",
        ),
        pytest.param(pb.SubmitJobRequest(spec=proto_spec(), job_id="a/b"), "job_id", id="a job id with a slash"),
        pytest.param(pb.SubmitJobRequest(), "tenant", id="no spec at all"),
    ],
)
async def test_bad_input_is_invalid_argument_naming_the_field_and_publishes_nothing(
    stub: pb_grpc.JobServiceStub, bus: Bus, request_: pb.SubmitJobRequest, field: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub.SubmitJob(request_, timeout=10)

    err = raised.value
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in (err.details() or "")
    [blob] = [v for k, v in err.trailing_metadata() or () if k == FIELD_ERRORS_METADATA]
    assert field in [e.field for e in pb.FieldErrors.FromString(blob).errors]
    assert await intake_count(bus) == 0


# --- read and list ---------------------------------------------------------------------------------------


async def test_get_job_returns_the_projected_status_run_placement_and_spec(
    stub: pb_grpc.JobServiceStub, bus: Bus, store: Store
) -> None:
    await record_job(bus, "j1")
    await project(bus, store, "JOBS")

    job = await stub.GetJob(pb.GetJobRequest(job_id="j1"), timeout=10)

    assert (job.status, job.run_id, job.attempt, job.tenant) == ("running", "j1-r1", 1, "acme")
    assert [(p.node_id, list(p.gpus)) for p in job.placement] == [("n1", [0, 1, 2, 3])]
    assert spec_from_proto(job.spec) == spec()
    assert not job.HasField("position")


async def test_list_jobs_scoped_to_a_tenant_returns_only_its_jobs(
    stub: pb_grpc.JobServiceStub, callers: Callers, bus: Bus, store: Store
) -> None:
    await record_job(bus, "j-mine", tenant="acme")
    await record_job(bus, "j-other", tenant="globex")
    await project(bus, store, "JOBS")

    scoped = await stub.ListJobs(pb.ListJobsRequest(), metadata=callers.metadata(ACME), timeout=10)
    everyone = await stub.ListJobs(pb.ListJobsRequest(limit=10), timeout=10)

    assert [j.job_id for j in scoped.jobs] == ["j-mine"]
    assert {j.job_id for j in everyone.jobs} == {"j-mine", "j-other"}


# --- cancel ----------------------------------------------------------------------------------------------


async def test_cancel_job_publishes_cancel_job_with_the_reason(
    stub: pb_grpc.JobServiceStub, bus: Bus, store: Store
) -> None:
    await record_job(bus, "j1")
    await project(bus, store, "JOBS")

    response = await stub.CancelJob(pb.CancelJobRequest(job_id="j1", reason="wrong dataset"), timeout=10)

    assert (response.job_id, response.status) == ("j1", "cancelling")
    command = decode_intake((await bus.js.get_last_msg("INTAKE", subjects.intake("acme"))).data)
    assert isinstance(command, CancelJob) and command.reason == "wrong dataset"


# --- error codes -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "request_", "caller", "code"),
    [
        pytest.param(
            "GetJob", pb.GetJobRequest(job_id="nope"), "admin", grpc.StatusCode.NOT_FOUND, id="an unknown job"
        ),
        pytest.param(
            "GetJob",
            pb.GetJobRequest(job_id="j-other"),
            ACME,
            grpc.StatusCode.NOT_FOUND,
            id="another tenant's job looks like no job",
        ),
        pytest.param(
            "CancelJob",
            pb.CancelJobRequest(job_id="j-other"),
            ACME,
            grpc.StatusCode.NOT_FOUND,
            id="cancelling another tenant's job looks like no job",
        ),
        pytest.param(
            "CancelJob",
            pb.CancelJobRequest(job_id="j-done"),
            "admin",
            grpc.StatusCode.FAILED_PRECONDITION,
            id="cancelling a finished job",
        ),
        pytest.param(
            "SubmitJob",
            pb.SubmitJobRequest(spec=proto_spec(tenant="globex")),
            ACME,
            grpc.StatusCode.PERMISSION_DENIED,
            id="submitting for another tenant",
        ),
        pytest.param(
            "ListJobs",
            pb.ListJobsRequest(tenant="globex"),
            ACME,
            grpc.StatusCode.PERMISSION_DENIED,
            id="listing another tenant's jobs",
        ),
        pytest.param(
            "ListJobs",
            pb.ListJobsRequest(status="sleeping"),
            "admin",
            grpc.StatusCode.INVALID_ARGUMENT,
            id="listing by an unknown status",
        ),
        pytest.param(
            "SubmitJob",
            pb.SubmitJobRequest(spec=proto_spec()),
            "finance",
            grpc.StatusCode.PERMISSION_DENIED,
            id="finance may not submit",
        ),
        pytest.param(
            "ListJobs", pb.ListJobsRequest(), None, grpc.StatusCode.UNAUTHENTICATED, id="a call without credentials"
        ),
    ],
)
async def test_failures_map_to_grpc_status_codes_and_publish_nothing(
    stub: pb_grpc.JobServiceStub,
    server: int,
    callers: Callers,
    bus: Bus,
    store: Store,
    metrics: GatewayMetrics,
    method: str,
    request_: Any,
    caller: str | None,
    code: grpc.StatusCode,
) -> None:
    await record_job(bus, "j-other", tenant="globex")
    await record_job(bus, "j-done", tenant="acme", until="succeeded")
    await project(bus, store, "JOBS")

    with pytest.raises(grpc.aio.AioRpcError) as raised:
        if caller is None:  # a channel of its own, with no default caller
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server}") as channel:
                await getattr(pb_grpc.JobServiceStub(channel), method)(request_, timeout=10)
        else:
            await getattr(stub, method)(request_, metadata=callers.metadata(caller), timeout=10)

    assert raised.value.code() == code
    assert await intake_count(bus) == 0
    assert (
        metrics.registry.get_sample_value(
            "trainyard_gateway_grpc_requests_total", {"method": method, "code": code.name}
        )
        == 1
    )


# --- conversion ------------------------------------------------------------------------------------------------


def test_a_full_spec_survives_the_trip_through_protobuf() -> None:
    original = JobSpec(
        tenant="acme",
        queue="research",
        name="moe-32k",
        priority_class="high",
        labels={"team": "llm", "cost-center": "42"},
        topology=TopologyConstraint(level=TopologyLevel.BLOCK, required=True),
        max_runtime_s=7200,
        image="registry/llm:1.2",
        command=["torchrun", "train.py"],
        roles=[
            Role(
                name="trainer",
                replicas=4,
                gpus_per_replica=8,
                gpu_type="H200",
                cpu_per_replica=96.0,
                memory_gib_per_replica=1024.0,
                topology=TopologyConstraint(level=TopologyLevel.NVLINK),
            ),
            Role(name="evaluator"),
        ],
    )

    assert spec_from_proto(spec_to_proto(original)) == original


async def test_list_jobs_pages_with_a_cursor_filters_by_time_and_refuses_a_damaged_cursor(
    stub: pb_grpc.JobServiceStub, bus: Bus, store: Store
) -> None:
    for n in range(5):
        await record_job(bus, f"j-{n}")  # submitted at 0.5
    await project(bus, store, "JOBS")

    ids, cursor = [], ""
    while True:
        page = await stub.ListJobs(pb.ListJobsRequest(limit=2, cursor=cursor), timeout=10)
        ids += [j.job_id for j in page.jobs]
        cursor = page.next_cursor
        if not cursor:
            break
    before = await stub.ListJobs(pb.ListJobsRequest(submitted_before=0.6), timeout=10)
    after = await stub.ListJobs(pb.ListJobsRequest(submitted_after=0.6), timeout=10)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub.ListJobs(pb.ListJobsRequest(cursor="not-a-cursor"), timeout=10)

    assert ids == ["j-4", "j-3", "j-2", "j-1", "j-0"]
    assert len(before.jobs) == 5 and not before.next_cursor and list(after.jobs) == []
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "cursor: the cursor is damaged or truncated" in (raised.value.details() or "")
