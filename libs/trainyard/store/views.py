"""Reads of the projections, for deciders, the gateway and the CLI.

A job is read as the lifecycle fold's :class:`~trainyard.core.lifecycle.JobRecord`,
decoded from its hash in one place (:mod:`trainyard.store.job_hash`); why a
waiting job waits is read beside it (:mod:`trainyard.store.waiting`)."""

from __future__ import annotations

import functools
from collections.abc import Iterable

import msgspec
from redis.asyncio.client import Pipeline

from trainyard.core import lifecycle
from trainyard.core.lifecycle import JobRecord
from trainyard.core.placement.snapshot import ClusterSnapshot, NodeView, PlacementPolicy, RunningAlloc
from trainyard.domain.job import JobSpec
from trainyard.domain.node import NodeInfo, NodeState
from trainyard.events.jobs import ReplicaPlacement
from trainyard.store import bulk, job_hash
from trainyard.store.store import Store

_node = msgspec.json.Decoder(NodeInfo)

#: Job statuses that have ended: nothing changes them any more.
TERMINAL = lifecycle.TERMINAL


class NodeRecord(msgspec.Struct):
    node_id: str
    state: str
    info: NodeInfo | None
    free_gpus: list[int]
    state_reason: str | None = None
    boot_id: str | None = None
    registered_at: float | None = None


# --- jobs: every read decodes the job hash with job_hash.decode_job ------------


def _read_jobs(
    pipe: Pipeline, store: Store, job_ids: list[str], fields: Iterable[str] | None
) -> tuple[str, ...] | None:
    """Queue the reads of ``job_ids``'s hashes (all fields, or ``fields`` and
    the head) on ``pipe``; returns the fields read, for :func:`job_hash.decode_rows`."""
    read = job_hash.read_fields(fields)
    for job_id in job_ids:
        if read is None:
            pipe.hgetall(store.key("job", job_id))
        else:
            pipe.hmget(store.key("job", job_id), *read)
    return read


_CHUNK = 4096  # jobs per script call: bounds one call's time in the server


async def get_jobs(store: Store, job_ids: list[str], fields: Iterable[str] | None = None) -> list[JobRecord]:
    """The records of the jobs among ``job_ids`` the projection holds, in
    order: whole, or only ``fields`` (and the head; the others take their
    defaults) for a reader that needs a few.  Selected fields are read
    :data:`_CHUNK` jobs per script call (:func:`bulk.read_chunks`: the HMGETs
    run in the server, and the next chunk's call is in the server while this
    one's rows are decoded), so the client packs and parses one command per
    chunk, not one per job."""
    read = job_hash.read_fields(fields)
    if read is None:
        pipe = store.redis.pipeline(transaction=False)
        _read_jobs(pipe, store, job_ids, None)
        return job_hash.decode_rows(job_ids, None, await pipe.execute())
    chunks = [job_ids[i : i + _CHUNK] for i in range(0, len(job_ids), _CHUNK)]
    keys = [[store.key("job", j) for j in ids] for ids in chunks]
    decoded = await bulk.read_chunks(store, keys, read, lambda k, rows: job_hash.decode_rows(chunks[k], read, rows))
    return [record for part in decoded for record in part]


async def get_job(store: Store, job_id: str, fields: Iterable[str] | None = None) -> JobRecord | None:
    """The job as the projection holds it; None when the projection has not folded it."""
    jobs = await get_jobs(store, [job_id], fields)
    return jobs[0] if jobs else None


async def job_tenant(store: Store, job_id: str) -> str | None:
    """The tenant of the job, read alone (its status and tenant, not the whole
    hash); None when the projection has not folded it."""
    status, tenant = await store.redis.hmget(store.key("job", job_id), "status", "tenant")
    return tenant if status else None


async def job_specs(store: Store, job_ids: list[str]) -> dict[str, JobSpec]:
    """The specs of ``job_ids``, decoded (a spec never changes: readers keep them)."""
    return {j.job_id: spec for j in await get_jobs(store, job_ids, ("spec",)) if (spec := j.job_spec) is not None}


async def list_jobs(
    store: Store, tenant: str | None = None, status: str | None = None, limit: int = 100, newest_first: bool = True
) -> list[JobRecord]:
    """Up to ``limit`` jobs, newest first (or oldest), of one tenant or all,
    of one status or any: the first pages of :func:`trainyard.store.job_pages.page_jobs`
    (which lists page by page, with more filters)."""
    from trainyard.store import job_pages  # it reads jobs with get_jobs, here

    query = job_pages.JobQuery(tenant=tenant, status=status, newest_first=newest_first)
    return await job_pages.list_jobs(store, query, limit)


async def ids_in(store: Store, index: str, limit: int = -1) -> list[str]:
    return await store.redis.zrange(store.key(index), 0, limit)


async def pending_window(store: Store, window: int) -> list[str]:
    """The pending jobs one admission cycle considers, oldest (lowest order) first: every
    pending job when there are at most ``window``; otherwise the oldest of every queue,
    ``window`` shared equally among the queues with pending jobs, so that one queue's deep
    backlog never hides another queue's jobs."""
    if await store.redis.zcard(store.key("pending")) <= window:
        return await ids_in(store, "pending", window - 1)
    queues = sorted(await store.redis.smembers(store.key("pendingqueues")))
    per_queue = max(1, window // max(1, len(queues)))
    pipe = store.redis.pipeline(transaction=False)
    for queue in queues:
        pipe.zrange(store.key("pendingq", queue), 0, per_queue - 1, withscores=True)
    oldest = sorted((score, job_id) for rows in await pipe.execute() for job_id, score in rows)
    return [job_id for _, job_id in oldest]


async def status_counts(store: Store) -> dict[str, int]:
    raw = await store.redis.hgetall(store.key("counts"))
    return {k: int(v) for k, v in raw.items() if int(v)}


async def gpus_by_type(store: Store, name: str) -> dict[str, int]:
    """``capacity`` (schedulable GPUs) or ``inuse`` (held by active jobs), per GPU type."""
    raw = await store.redis.hgetall(store.key(name))
    return {k: int(v) for k, v in raw.items()}


@functools.lru_cache(maxsize=65_536)
def _node_info(raw: str) -> NodeInfo:
    """Node descriptions rarely change; decode each distinct one once."""
    return _node.decode(raw)


async def node_views(store: Store) -> list[tuple[NodeInfo, str, list[int]]]:
    """Every registered node as ``(info, state, free GPU indices)``, in three
    reads however large the fleet (what the placement cycle needs)."""
    pipe = store.redis.pipeline(transaction=False)
    pipe.hgetall(store.key("nodeinfo"))
    pipe.hgetall(store.key("nodestate"))
    pipe.hgetall(store.key("gpumap"))
    infos, states, maps = await pipe.execute()
    out = []
    for node_id in sorted(infos):
        info = _node_info(infos[node_id])
        held = maps.get(node_id, "")
        free = [g for g in range(info.gpus) if g >= len(held) or held[g] != "#"]
        out.append((info, states.get(node_id, "unknown"), free))
    return out


async def list_nodes(store: Store) -> list[NodeRecord]:
    """Nodes with their state details, for people (the API and the CLI)."""
    views = await node_views(store)
    pipe = store.redis.pipeline(transaction=False)
    for info, _, _ in views:
        pipe.hmget(store.key("node", info.node_id), "state_reason", "boot_id", "registered_at")
    details = await pipe.execute()
    return [
        NodeRecord(
            node_id=info.node_id,
            state=state,
            info=info,
            free_gpus=free,
            state_reason=reason,
            boot_id=boot,
            registered_at=float(registered) if registered else None,
        )
        for (info, state, free), (reason, boot, registered) in zip(views, details, strict=True)
    ]


class ProjectedNode(msgspec.Struct, frozen=True, kw_only=True):
    """One node as the NODES projection alone holds it (free GPUs follow JOBS and are not part of it)."""

    node_id: str
    info: NodeInfo
    state: str
    boot_id: str | None  # the boot it last registered with
    registered_at: float | None


class Roster(msgspec.Struct, frozen=True):
    """Every registered node of the NODES projection, by node id; read-only."""

    nodes: tuple[ProjectedNode, ...] = ()  # by node id

    @property
    def infos(self) -> dict[str, NodeInfo]:
        """Each node's info by node id (a new dict on each call)."""
        return {n.node_id: n.info for n in self.nodes}

    @property
    def states(self) -> dict[str, str]:
        """Each node's projected state by node id (a new dict on each call)."""
        return {n.node_id: n.state for n in self.nodes}


async def read_roster(store: Store) -> Roster:
    """The NODES projection's nodes (what health judges liveness and decisions on)."""
    pipe = store.redis.pipeline(transaction=False)
    pipe.hgetall(store.key("nodeinfo"))
    pipe.hgetall(store.key("nodestate"))
    infos, states = await pipe.execute()
    ids = sorted(infos)
    pipe = store.redis.pipeline(transaction=False)
    for node_id in ids:
        pipe.hmget(store.key("node", node_id), "boot_id", "registered_at")
    details = await pipe.execute()
    nodes = tuple(
        ProjectedNode(
            node_id=node_id,
            info=_node_info(infos[node_id]),
            state=states.get(node_id, "unknown"),
            boot_id=boot,
            registered_at=float(registered) if registered else None,
        )
        for node_id, (boot, registered) in zip(ids, details, strict=True)
    )
    return Roster(nodes)


async def jobs_on_node(store: Store, node_id: str) -> list[str]:
    return sorted(await store.redis.smembers(store.key("noderuns", node_id)))


async def violations(store: Store) -> list[str]:
    return await store.redis.lrange(store.key("violations"), 0, -1)


# --- placement's reads and writes -------------------------------------------


#: What placement reads of each active job every cycle (besides the head).
ACTIVE_FIELDS = ("run_id", "started_at", "placed_at", "last_checkpoint_at", "admitted_at")


async def placement_state(
    store: Store, job_ids: list[str]
) -> tuple[list[tuple[NodeInfo, str, list[int]]], list[JobRecord]]:
    """Every node as ``(info, state, free GPU indices)`` and the given jobs
    (:data:`ACTIVE_FIELDS` of them), read in one transaction so the free GPUs
    and the runs holding GPUs describe the same moment of the projection."""
    pipe = store.redis.pipeline(transaction=True)
    pipe.hgetall(store.key("nodeinfo"))
    pipe.hgetall(store.key("nodestate"))
    pipe.hgetall(store.key("gpumap"))
    read = _read_jobs(pipe, store, job_ids, ACTIVE_FIELDS)
    infos, states, maps, *rows = await pipe.execute()
    nodes = []
    for node_id in sorted(infos):
        info = _node_info(infos[node_id])
        held = maps.get(node_id, "")
        free = [g for g in range(info.gpus) if g >= len(held) or held[g] != "#"]
        nodes.append((info, states.get(node_id, "unknown"), free))
    return nodes, job_hash.decode_rows(job_ids, read, rows)


async def run_placements(store: Store, job_ids: list[str]) -> dict[str, tuple[str, list[ReplicaPlacement]]]:
    """Each placed job's ``(current run id, replicas)``; jobs without a placement are left out."""
    return {
        j.job_id: (j.run_id, list(j.placement))
        for j in await get_jobs(store, job_ids, ("run_id", "placement"))
        if j.run_id and j.placement
    }


# --- the cluster as the placement core sees it --------------------------------

#: Job statuses whose current run holds GPUs.
HOLDING = frozenset({"placed", "running"})


class ClusterReader:
    """Builds the placement core's ``ClusterSnapshot`` from the projections:
    every node of one cluster with its free GPUs, and every run holding GPUs
    with where it runs, when it started, its limit and its last checkpoint.

    Placement reads it every cycle; admission reads it to choose preemption
    victims where the waiting gang can use their GPUs.  A job's spec and a
    run's replicas never change, so each is read and decoded once and kept
    while the job is active.  Whether a run may be preempted, and its
    priority, come from the tenancy, not the projection: the allocations
    leave them at their defaults (admission picks the candidates it may stop).
    """

    def __init__(self, store: Store, cluster: str, policy: PlacementPolicy | None = None) -> None:
        self.store = store
        self.cluster = cluster
        self.policy = policy or PlacementPolicy()
        self.specs: dict[str, JobSpec] = {}  # job id -> spec, for every active job
        self.replicas: dict[str, list[ReplicaPlacement]] = {}  # run id -> where it runs

    async def read(self, job_ids: list[str]) -> tuple[ClusterSnapshot, dict[str, JobRecord]]:
        """The cluster and the records (:data:`ACTIVE_FIELDS`) of the jobs among
        ``job_ids`` that hold or wait for GPUs (admitted, placed, running), from
        one consistent read."""
        node_rows, heads = await placement_state(self.store, job_ids)
        jobs = {j.job_id: j for j in heads if j.run_id and (j.status == "admitted" or j.status in HOLDING)}
        missing = [j for j in jobs if j not in self.specs]
        if missing:
            self.specs.update(await job_specs(self.store, missing))
        for job_id in [j for j in self.specs if j not in jobs]:
            del self.specs[job_id]  # no longer active
        running = await self._running([j for j in jobs.values() if j.status in HOLDING])
        nodes = [
            NodeView(info=info, free_gpus=tuple(free), schedulable=state == NodeState.HEALTHY.value)
            for info, state, free in node_rows
            if info.cluster == self.cluster
        ]
        return ClusterSnapshot(nodes=nodes, running=running, policy=self.policy), jobs

    async def _running(self, holding: list[JobRecord]) -> list[RunningAlloc]:
        """Every run holding GPUs, with its latest end and its last checkpoint."""
        new = [j.job_id for j in holding if j.run_id not in self.replicas]
        if new:
            for run_id, replicas in (await run_placements(self.store, new)).values():
                self.replicas[run_id] = replicas
        current = {j.run_id for j in holding}
        for run_id in [r for r in self.replicas if r not in current]:
            del self.replicas[run_id]
        out = []
        for j in holding:
            replicas = self.replicas.get(j.run_id or "")
            spec = self.specs.get(j.job_id)
            started = j.started_at if j.started_at is not None else j.placed_at
            if replicas is None or spec is None or started is None:
                continue
            # A checkpoint older than this run (it resumed from it) saves none of this run's work.
            checkpoint = j.last_checkpoint_at if j.last_checkpoint_at and j.last_checkpoint_at >= started else None
            out.append(
                RunningAlloc(
                    job_id=j.job_id,
                    run_id=j.run_id or "",
                    replicas=replicas,
                    started_at=started,
                    max_runtime_s=float(spec.max_runtime_s),
                    last_checkpoint_at=checkpoint,
                )
            )
        return out
