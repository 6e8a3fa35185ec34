"""A job's output: ``GET /v1/jobs/{job_id}/logs`` (and gRPC ``GetJobLogs``).

Logs stay on the nodes that ran the processes (docs/execution.md, "Logs"): the
gateway finds the node that ran the asked rank of the asked attempt and asks its
agent for a chunk over NATS request/reply (the agent's ``logs`` control request).

Which node ran a rank is worked out, not stored: the job's ``JobAdmitted``
events give each attempt its run id, its ``JobPlaced`` events where each replica
of a run went, and the pure execution planner (``trainyard.core.execution``)
numbers the processes exactly as the dispatcher did when it started them.

Reading is allowed to whoever may read the job (its own tenant's people, operators
and admins); a rank or attempt that does not exist is a 422 naming it.
"""

from __future__ import annotations

import msgspec
import nats.errors
from fastapi import APIRouter, Query
from fastapi.responses import Response
from nats.js.errors import NotFoundError

from trainyard.agent import control
from trainyard.auth import Action, Principal, tenant_filter
from trainyard.bus import Bus
from trainyard.core.execution import plan
from trainyard.core.lifecycle import TERMINAL, JobRecord
from trainyard.domain.job import JobSpec, ValidationError
from trainyard.domain.node import NodeInfo
from trainyard.events import JobAdmitted, JobPlaced, decode_job_event, subjects
from trainyard.settings import Settings
from trainyard.store import Store
from trainyard_gateway.errors import json_response
from trainyard_gateway.jobs import Conflict, InvalidRequest, JobOperations
from trainyard_gateway.openapi import answer
from trainyard_gateway.schema import ErrorBody, LogChunk
from trainyard_gateway.security import allow

#: The most one answer carries.
MAX_CHUNK = 64 * 1024
AGENT_TIMEOUT_S = 5.0


class LogsUnavailable(nats.errors.Error):
    """The agent of the node that holds the log does not answer now (503 / UNAVAILABLE)."""


class Attempt(msgspec.Struct, frozen=True):
    attempt: int
    run_id: str
    placed: JobPlaced | None


async def attempts_of(bus: Bus, job: JobRecord) -> dict[int, Attempt]:
    """Every attempt of ``job`` with its placement, from the job's history on JOBS."""
    admitted: dict[str, int] = {}
    placed: dict[str, JobPlaced] = {}
    subject = subjects.job_history(job.tenant, job.job_id)
    seq = 1
    while True:
        try:
            msg = await bus.js.get_msg("JOBS", seq=seq, subject=subject, next=True)
        except NotFoundError:
            break
        seq = (msg.seq or seq) + 1
        try:
            event = decode_job_event(msg.data or b"")
        except msgspec.DecodeError:
            continue
        if isinstance(event, JobAdmitted):
            admitted[event.run_id] = event.attempt
        elif isinstance(event, JobPlaced) and event.run_id not in placed:
            placed[event.run_id] = event
        if seq > job.last_seq:
            break
    return {n: Attempt(n, run, placed.get(run)) for run, n in admitted.items()}


def ranks_by_node(spec: JobSpec, job: JobRecord, placed: JobPlaced, attempt: int) -> dict[str, list[int]]:
    """The process ranks each node of the run started, numbered as the dispatcher numbered them."""
    orders = plan(
        spec,
        job_id=job.job_id,
        tenant=job.tenant,
        run_id=placed.run_id,
        attempt=attempt,
        cluster=placed.cluster,
        replicas=list(placed.replicas),
        nodes={},
        master_port=0,
        resume_from_step=None,
        at=placed.at,
    )
    return {node_id: [p.rank for p in order.processes] for node_id, order in orders.items()}


class JobLogs:
    def __init__(self, bus: Bus, store: Store) -> None:
        self.bus = bus
        self.store = store

    async def read(
        self, job: JobRecord, rank: int = 0, attempt: int | None = None, offset: int = 0, limit: int = MAX_CHUNK
    ) -> LogChunk:
        spec = job.job_spec
        if spec is None:
            raise InvalidRequest([ValidationError("job_id", f"job {job.job_id} was rejected: it has no logs")])
        attempts = await attempts_of(self.bus, job)
        if not attempts:
            raise InvalidRequest([ValidationError("attempt", f"job {job.job_id} has not run yet: no logs so far")])
        latest = max(attempts)
        number = latest if attempt is None or attempt == 0 else attempt
        if number not in attempts:
            raise InvalidRequest(
                [
                    ValidationError(
                        "attempt", f"job {job.job_id} has attempts 1 to {latest}; there is no attempt {number}"
                    )
                ]
            )
        run = attempts[number]
        if run.placed is None:
            raise InvalidRequest([ValidationError("attempt", f"attempt {number} was never placed: it has no logs")])
        ranks = ranks_by_node(spec, job, run.placed, number)
        node_id = next((node for node, held in ranks.items() if rank in held), None)
        if node_id is None:
            count = sum(len(held) for held in ranks.values())
            raise InvalidRequest(
                [ValidationError("rank", f"ranks of attempt {number} are 0 to {count - 1}; not {rank}")]
            )
        info = await _node_info(self.store, node_id)
        if info is None or not info.executes:
            raise Conflict(f"job {job.job_id}: rank {rank} ran on {node_id}, an emulated node, which keeps no logs")
        finished = number != job.attempt or job.status in TERMINAL or job.status == "pending"
        reply = await self._ask(info, job, number, rank, offset, limit)
        details = reply.details
        return LogChunk(
            job_id=job.job_id,
            attempt=number,
            rank=rank,
            node_id=node_id,
            offset=int(details.get("offset", "0")),
            next_offset=int(details.get("next_offset", "0")),
            size=int(details.get("size", "0")),
            data=reply.data.decode("utf-8", errors="replace"),
            finished=finished,
        )

    async def _ask(
        self, info: NodeInfo, job: JobRecord, attempt: int, rank: int, offset: int, limit: int
    ) -> control.ControlReply:
        request = control.ControlRequest(
            op="logs", node_id=info.node_id, job_id=job.job_id, attempt=attempt, rank=rank, offset=offset, limit=limit
        )
        subject = control.agent_logs_subject(info.cluster, info.node_id)
        try:
            msg = await self.bus.nc.request(subject, control.encode(request), timeout=AGENT_TIMEOUT_S)
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as err:
            raise LogsUnavailable(
                f"the agent of {info.node_id} did not answer ({type(err).__name__}); the logs stay on that node"
            ) from err
        reply = control.decode_reply(msg.data)
        if not reply.ok:
            raise Conflict(f"job {job.job_id}: {reply.message}")
        return reply


async def read_logs(
    ops: JobOperations,
    job_id: str,
    tenant: str | None,
    rank: int = 0,
    attempt: int | None = None,
    offset: int = 0,
    limit: int = MAX_CHUNK,
) -> LogChunk:
    """One chunk of a job's output, for a caller allowed to read the job (``tenant``: theirs, None: any)."""
    problems = []
    if rank < 0:
        problems.append(ValidationError("rank", f"a rank is 0 or more, not {rank}"))
    if attempt is not None and attempt < 0:
        problems.append(ValidationError("attempt", f"an attempt is 1 or more (0: the latest), not {attempt}"))
    if not 1 <= limit <= MAX_CHUNK:
        problems.append(ValidationError("limit", f"between 1 and {MAX_CHUNK} bytes, not {limit}"))
    if problems:
        raise InvalidRequest(problems)
    job = await ops.record(job_id, tenant)
    return await JobLogs(ops.bus, ops.store).read(job, rank, attempt, offset, limit)


_node = msgspec.json.Decoder(NodeInfo)


async def _node_info(store: Store, node_id: str) -> NodeInfo | None:
    """One node's registration (the NODES projection's ``nodeinfo`` hash), without reading the fleet."""
    raw = await store.redis.hget(store.key("nodeinfo"), node_id)
    return None if raw is None else _node.decode(raw)


_UNAVAILABLE = answer(503, "The agent of the node holding the log does not answer now; try again", ErrorBody)
_CONFLICT = answer(409, "The rank ran where no log is kept (an emulated node), or its log is gone", ErrorBody)


def build_router(bus: Bus, store: Store, settings: Settings) -> APIRouter:
    """``GET /v1/jobs/{job_id}/logs``: what :func:`read_logs` reads."""
    router = APIRouter()
    ops = JobOperations(bus, store)

    @router.get(
        "/v1/jobs/{job_id}/logs",
        summary="Read one rank's output (stdout and stderr) of one attempt",
        responses={
            **answer(200, "A chunk of the log; ask again from next_offset to follow it", LogChunk),
            **answer(404, "No such job (or not visible to this caller)", ErrorBody),
            **answer(422, "Bad input: one entry per bad field", ErrorBody),
            **_CONFLICT,
            **_UNAVAILABLE,
        },
    )
    async def job_logs(
        job_id: str,
        who: Principal = allow(Action.JOB_READ),
        rank: int = Query(0, description="The process rank (RANK)"),
        attempt: int = Query(0, description="The attempt; 0: the latest"),
        offset: int = Query(0, description="Byte offset to read from; negative: that many bytes before the end"),
        limit: int = Query(MAX_CHUNK, description=f"At most this many bytes (1 to {MAX_CHUNK})"),
    ) -> Response:
        tenant = tenant_filter(who, Action.JOB_READ, None)
        return json_response(await read_logs(ops, job_id, tenant, rank, attempt or None, offset, limit))

    return router
