"""The gRPC front door (``trainyard.v1.JobService``) over the same
:class:`~trainyard_gateway.jobs.JobOperations` as REST.

Errors map to status codes in one place (:meth:`JobService._serve`):
bad input -> INVALID_ARGUMENT (details list ``field: message``; the binary
trailing metadata ``trainyard-field-errors-bin`` carries a ``FieldErrors``),
unknown job -> NOT_FOUND, finished job -> FAILED_PRECONDITION, a job id
another tenant's job has -> ALREADY_EXISTS, missing or bad credentials ->
UNAUTHENTICATED, a role that may not -> PERMISSION_DENIED, NATS or Redis down
-> UNAVAILABLE.

Every call carries ``authorization: Bearer <API token or JWT>`` metadata,
verified and authorized exactly like REST (:mod:`trainyard.auth`): the
principal's role and tenant decide, never anything else the client sends.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
import msgspec
from google.protobuf.message import DecodeError

from trainyard._pb.trainyard.v1 import jobs_pb2 as pb
from trainyard._pb.trainyard.v1 import jobs_pb2_grpc as pb_grpc
from trainyard.auth import Action, Authenticator, PermissionDenied, Principal, Unauthenticated, authorize, tenant_filter
from trainyard.domain.job import JobSpec, Role, TopologyConstraint, ValidationError
from trainyard_gateway import pages
from trainyard_gateway.decoding import convert
from trainyard_gateway.errors import UNAVAILABLE
from trainyard_gateway.jobs import (
    MAX_LIST_LIMIT,
    MAX_REASON_CHARS,
    MAX_SUBMIT_BYTES,
    Conflict,
    InvalidRequest,
    JobIdTaken,
    JobOperations,
    NotFound,
    check_tenant_name,
    require_valid,
)
from trainyard_gateway.logs_api import MAX_CHUNK, read_logs
from trainyard_gateway.metrics import GatewayMetrics
from trainyard_gateway.schema import JobView

log = logging.getLogger(__name__)

AUTHORIZATION_METADATA = "authorization"
FIELD_ERRORS_METADATA = "trainyard-field-errors-bin"
MAX_MESSAGE_BYTES = MAX_SUBMIT_BYTES  # as REST: far below the 1 MiB NATS payload limit
_LEVEL_PREFIX = "TOPOLOGY_LEVEL_"

T = TypeVar("T")


# --- protobuf <-> domain ------------------------------------------------------------


def _optional(message: Any, names: tuple[str, ...]) -> dict[str, Any]:
    return {name: getattr(message, name) for name in names if message.HasField(name)}


def _topology_from_proto(t: pb.TopologyConstraint, field: str) -> dict[str, Any]:
    if t.level not in pb.TopologyLevel.values():  # proto3 enums are open: any number arrives
        names = ", ".join(pb.TopologyLevel.keys())
        raise InvalidRequest(
            [ValidationError(f"{field}.level", f"{t.level} is not a TopologyLevel; use one of {names}")]
        )
    level = pb.TopologyLevel.Name(t.level).removeprefix(_LEVEL_PREFIX).lower()
    return {"level": level, "required": t.required}


def _role_from_proto(r: pb.Role, field: str) -> dict[str, Any]:
    role = {"name": r.name, **_optional(r, ("replicas", "gpus_per_replica", "gpu_type", "cpu_per_replica"))}
    role.update(_optional(r, ("memory_gib_per_replica", "working_dir", "launch")))
    role.update(command=list(r.command), env=dict(r.env))
    if r.HasField("topology"):
        role["topology"] = _topology_from_proto(r.topology, f"{field}.topology")
    return role


def spec_from_proto(s: pb.JobSpec) -> JobSpec:
    """Build a JobSpec; unset optional fields take the JobSpec defaults."""
    raw: dict[str, Any] = {
        "tenant": s.tenant,
        "queue": s.queue,
        "roles": [_role_from_proto(r, f"spec.roles[{i}]") for i, r in enumerate(s.roles)],
        "labels": dict(s.labels),
        "command": list(s.command),
        **_optional(s, ("name", "priority_class", "max_runtime_s", "image", "workload_ref", "simulated_duration_s")),
        **_optional(s, ("stop_signal", "stop_grace_s", "checkpoint_dir")),
    }
    if s.HasField("topology"):
        raw["topology"] = _topology_from_proto(s.topology, "spec.topology")
    return convert(raw, JobSpec, root="spec")


def _topology_to_proto(t: TopologyConstraint) -> pb.TopologyConstraint:
    return pb.TopologyConstraint(level=pb.TopologyLevel.Value(_LEVEL_PREFIX + t.level.name), required=t.required)


def _role_to_proto(r: Role) -> pb.Role:
    role = pb.Role(
        name=r.name,
        replicas=r.replicas,
        gpus_per_replica=r.gpus_per_replica,
        gpu_type=r.gpu_type,
        cpu_per_replica=r.cpu_per_replica,
        memory_gib_per_replica=r.memory_gib_per_replica,
        command=r.command,
        env=r.env,
        launch=r.launch,
    )
    if r.working_dir is not None:
        role.working_dir = r.working_dir
    if r.topology is not None:
        role.topology.CopyFrom(_topology_to_proto(r.topology))
    return role


def spec_to_proto(s: JobSpec) -> pb.JobSpec:
    spec = pb.JobSpec(
        tenant=s.tenant,
        queue=s.queue,
        roles=[_role_to_proto(r) for r in s.roles],
        name=s.name,
        priority_class=s.priority_class,
        labels=s.labels,
        max_runtime_s=s.max_runtime_s,
        command=s.command,
        stop_signal=s.stop_signal,
        stop_grace_s=s.stop_grace_s,
    )
    for name in ("image", "workload_ref", "simulated_duration_s", "checkpoint_dir"):
        if getattr(s, name) is not None:
            setattr(spec, name, getattr(s, name))
    if s.topology is not None:
        spec.topology.CopyFrom(_topology_to_proto(s.topology))
    return spec


def job_to_proto(j: JobView) -> pb.Job:
    job = pb.Job(
        job_id=j.job_id,
        status=j.status,
        tenant=j.tenant,
        queue=j.queue or "",
        name=j.name or "",
        priority_class=j.priority_class or "",
        gpus=j.gpus,
        reason=j.reason or "",
        message=j.message or "",
        run_id=j.run_id or "",
        attempt=j.attempt,
        requeues=j.requeues,
        placement=[
            pb.ReplicaPlacement(role=p.role, replica=p.replica, rank=p.rank, node_id=p.node_id, gpus=p.gpus)
            for p in j.placement or []
        ],
        errors=[pb.FieldError(field=e.get("field", ""), message=e.get("message", "")) for e in j.errors or []],
    )
    for name in ("position", "submitted_at", "accepted_at", "admitted_at", "placed_at", "started_at", "finished_at"):
        if getattr(j, name) is not None:
            setattr(job, name, getattr(j, name))
    if j.spec is not None:
        job.spec.CopyFrom(spec_to_proto(j.spec))
    return job


# --- the service ---------------------------------------------------------------------------


def _authorization(context: grpc.aio.ServicerContext) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == AUTHORIZATION_METADATA:
            return value if isinstance(value, str) else None
    return None


_MAPPED = (InvalidRequest, Unauthenticated, PermissionDenied, NotFound, JobIdTaken, Conflict, *UNAVAILABLE)
_Trailing = tuple[tuple[str, bytes], ...]


def _status_of(err: BaseException) -> tuple[grpc.StatusCode, str, _Trailing]:
    """The status code, details and trailing metadata a failed call answers with."""
    if isinstance(err, InvalidRequest):
        fields = pb.FieldErrors(errors=[pb.FieldError(field=e.field, message=e.message) for e in err.errors])
        details = "invalid request, nothing was changed: " + "; ".join(str(e) for e in err.errors)
        return grpc.StatusCode.INVALID_ARGUMENT, details, ((FIELD_ERRORS_METADATA, fields.SerializeToString()),)
    if isinstance(err, Unauthenticated):
        return grpc.StatusCode.UNAUTHENTICATED, str(err), ()
    if isinstance(err, PermissionDenied):
        return grpc.StatusCode.PERMISSION_DENIED, str(err), ()
    if isinstance(err, NotFound):
        return grpc.StatusCode.NOT_FOUND, f"no job {str(err)!r}", ()
    if isinstance(err, JobIdTaken):
        return grpc.StatusCode.ALREADY_EXISTS, str(err), ()
    if isinstance(err, Conflict):
        return grpc.StatusCode.FAILED_PRECONDITION, str(err), ()
    return (grpc.StatusCode.UNAVAILABLE, f"NATS, Redis or the identity provider is unavailable, try again: {err!r}", ())


class JobService(pb_grpc.JobServiceServicer):
    def __init__(self, ops: JobOperations, auth: Authenticator, metrics: GatewayMetrics | None = None) -> None:
        self.ops = ops
        self.auth = auth
        self.metrics = metrics

    async def _caller(self, context: grpc.aio.ServicerContext, action: Action) -> Principal:
        """The verified caller, if its role may do ``action``."""
        who = await self.auth.authenticate(_authorization(context))
        authorize(who, action)
        return who

    async def _serve(self, method: str, context: grpc.aio.ServicerContext, work: Callable[[], Awaitable[T]]) -> T:
        """Run one call and map its failure to a status code (the only place
        that does).  The call is counted before its status goes out, so a
        client that saw the status also sees it in the metrics."""
        code = grpc.StatusCode.OK
        try:
            return await work()
        except _MAPPED as err:
            code, message, trailing = _status_of(err)
        except BaseException:
            code = grpc.StatusCode.UNKNOWN
            raise
        finally:
            if self.metrics is not None:
                self.metrics.grpc_requests.labels(method, code.name).inc()
        await context.abort(code, message, trailing_metadata=trailing)
        raise AssertionError("unreachable: abort raises")

    async def SubmitJob(self, request: pb.SubmitJobRequest, context: grpc.aio.ServicerContext) -> pb.SubmitJobResponse:
        async def work() -> pb.SubmitJobResponse:
            who = await self._caller(context, Action.JOB_SUBMIT)
            spec = spec_from_proto(request.spec)
            require_valid(check_tenant_name(spec.tenant))
            tenant_filter(who, Action.JOB_SUBMIT, spec.tenant)
            job_id = await self.ops.submit(spec, request.job_id or None, actor=who.actor)
            return pb.SubmitJobResponse(job_id=job_id, status="submitted")

        return await self._serve("SubmitJob", context, work)

    async def GetJob(self, request: pb.GetJobRequest, context: grpc.aio.ServicerContext) -> pb.Job:
        async def work() -> pb.Job:
            who = await self._caller(context, Action.JOB_READ)
            return job_to_proto(await self.ops.get(request.job_id, tenant_filter(who, Action.JOB_READ, None)))

        return await self._serve("GetJob", context, work)

    async def ListJobs(self, request: pb.ListJobsRequest, context: grpc.aio.ServicerContext) -> pb.ListJobsResponse:
        async def work() -> pb.ListJobsResponse:
            who = await self._caller(context, Action.JOB_LIST)
            if not 0 <= request.limit <= MAX_LIST_LIMIT:
                raise InvalidRequest(
                    [ValidationError("limit", f"must be between 1 and {MAX_LIST_LIMIT} (0 means 100)")]
                )
            query, after = pages.job_request(
                who,
                request.tenant or None,
                request.status or None,
                request.submitted_after if request.HasField("submitted_after") else None,
                request.submitted_before if request.HasField("submitted_before") else None,
                request.cursor or None,
            )
            page = await pages.job_page(self.ops, query, request.limit or 100, after, request.archived)
            return pb.ListJobsResponse(jobs=[job_to_proto(j) for j in page.jobs], next_cursor=page.next_cursor or "")

        return await self._serve("ListJobs", context, work)

    async def GetJobLogs(self, request: pb.GetJobLogsRequest, context: grpc.aio.ServicerContext) -> pb.JobLogs:
        async def work() -> pb.JobLogs:
            who = await self._caller(context, Action.JOB_READ)
            chunk = await read_logs(
                self.ops,
                request.job_id,
                tenant_filter(who, Action.JOB_READ, None),
                rank=request.rank,
                attempt=request.attempt or None,
                offset=request.offset,
                limit=request.limit or MAX_CHUNK,
            )
            return pb.JobLogs(**msgspec.structs.asdict(chunk))

        return await self._serve("GetJobLogs", context, work)

    async def CancelJob(self, request: pb.CancelJobRequest, context: grpc.aio.ServicerContext) -> pb.CancelJobResponse:
        async def work() -> pb.CancelJobResponse:
            who = await self._caller(context, Action.JOB_CANCEL)
            if len(request.reason) > MAX_REASON_CHARS:
                raise InvalidRequest([ValidationError("reason", f"at most {MAX_REASON_CHARS} characters")])
            scope = tenant_filter(who, Action.JOB_CANCEL, None)
            reason = request.reason or "cancelled by user"
            job = await self.ops.cancel(request.job_id, scope, reason, actor=who.actor)
            return pb.CancelJobResponse(job_id=job.job_id, status="cancelling")

        return await self._serve("CancelJob", context, work)


#: Each method of the proto's JobService with its request and response types,
#: to read and write the bytes ourselves.
_METHODS = {
    m.name: (getattr(pb, m.input_type.name), getattr(pb, m.output_type.name))
    for m in pb.DESCRIPTOR.services_by_name["JobService"].methods
}


def _parsing(service: JobService, name: str, request_type: Any) -> Callable[..., Awaitable[Any]]:
    """``service``'s method ``name`` behind its own decoding of the request:
    bytes that are not a ``request_type`` are INVALID_ARGUMENT (grpc's own
    deserializer would answer UNKNOWN and log a traceback)."""
    method = getattr(service, name)

    async def handle(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
        try:
            request = request_type.FromString(raw)
        except DecodeError as err:
            if service.metrics is not None:
                service.metrics.grpc_requests.labels(name, grpc.StatusCode.INVALID_ARGUMENT.name).inc()
            what = request_type.DESCRIPTOR.full_name
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the request is not a valid {what}: {err}")
        return await method(request, context)

    return handle


def add_job_service(server: grpc.aio.Server, service: JobService) -> None:
    """Serve ``service`` as ``trainyard.v1.JobService`` (as the generated
    ``add_JobServiceServicer_to_server`` does, but decoding requests itself)."""
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(
            _parsing(service, name, request_type), response_serializer=response_type.SerializeToString
        )
        for name, (request_type, response_type) in _METHODS.items()
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("trainyard.v1.JobService", handlers),))
    server.add_registered_method_handlers("trainyard.v1.JobService", handlers)


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


async def start_grpc(
    ops: JobOperations, auth: Authenticator, host: str, port: int, metrics: GatewayMetrics | None = None
) -> grpc.aio.Server:
    """Start serving JobService on ``host:port``; stop it with ``await server.stop(grace)``."""
    options = [("grpc.so_reuseport", 0), ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
    server = grpc.aio.server(options=options)  # a port in use is an error, not a share
    add_job_service(server, JobService(ops, auth, metrics))
    try:
        bound = server.add_insecure_port(_address(host, port))
    except RuntimeError as err:
        raise OSError(f"cannot listen for gRPC on {_address(host, port)}: the address is in use or not local") from err
    if bound == 0:
        raise OSError(f"cannot listen for gRPC on {_address(host, port)}")
    await server.start()
    log.info("gRPC JobService listening on %s", _address(host, bound))
    return server
