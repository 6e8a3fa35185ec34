"""Reads of the projections, for deciders, the gateway and the CLI."""

from __future__ import annotations

import functools
import json

import msgspec

from trainyard.core.placement.snapshot import ClusterSnapshot, NodeView, PlacementPolicy, RunningAlloc
from trainyard.domain.job import JobSpec
from trainyard.domain.node import NodeInfo, NodeState
from trainyard.events.jobs import ReplicaPlacement
from trainyard.store import job_hash, waiting
from trainyard.store.projector import Store
from trainyard.store.waiting import Waiting

_spec = msgspec.json.Decoder(JobSpec)
_node = msgspec.json.Decoder(NodeInfo)
_replicas = msgspec.json.Decoder(list[ReplicaPlacement])

TERMINAL = frozenset({"succeeded", "failed", "cancelled", "rejected"})


class JobView(msgspec.Struct):
    """A job as the projection sees it, for people and deciders."""

    job_id: str
    status: str
    tenant: str
    queue: str | None = None
    name: str | None = None
    priority_class: str | None = None
    gpus: int = 0
    order: int = 0
    attempt: int = 0
    requeues: int = 0
    run_id: str | None = None
    last_seq: int = 0
    submitted_at: float | None = None
    accepted_at: float | None = None
    admitted_at: float | None = None
    placed_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    reason: str | None = None
    message: str | None = None
    position: int | None = None
    not_before: float | None = None  # waiting out a backoff until then
    expected_start: float | None = None  # placement's estimate, when a reservation holds room for it
    last_checkpoint_step: int | None = None
    preempt_deadline: float | None = None  # told to stop by then (preemption notice)
    errors: list[dict[str, str]] | None = None
    placement: list[ReplicaPlacement] | None = None
    spec: JobSpec | None = None

    @classmethod
    def from_hash(
        cls, job_id: str, h: dict[str, str], with_spec: bool = True, why: Waiting | None = None
    ) -> JobView:
        def f(name: str) -> float | None:
            return float(h[name]) if h.get(name) else None

        return cls(
            job_id=job_id,
            status=h.get("status", "unknown"),
            tenant=h.get("tenant", ""),
            queue=h.get("queue"),
            name=h.get("name"),
            priority_class=h.get("priority_class"),
            gpus=int(h.get("gpus") or 0),
            order=int(h.get("order") or 0),
            attempt=int(h.get("attempt") or 0),
            requeues=int(h.get("requeues") or 0),
            run_id=h.get("run_id") or None,
            last_seq=int(h.get("last_seq") or 0),
            submitted_at=f("submitted_at"),
            accepted_at=f("accepted_at"),
            admitted_at=f("admitted_at"),
            placed_at=f("placed_at"),
            started_at=f("started_at"),
            finished_at=f("finished_at"),
            reason=why.reason if why else h.get("reason") or None,
            message=h.get("message") or None,
            position=why.position if why else None,
            not_before=f("not_before"),
            expected_start=why.expected_start if why else None,
            last_checkpoint_step=int(h["last_checkpoint_step"]) if h.get("last_checkpoint_step") else None,
            preempt_deadline=f("preempt_deadline"),
            errors=json.loads(h["errors"]) if h.get("errors") else None,
            placement=_replicas.decode(h["placement"]) if h.get("placement") else None,
            spec=_spec.decode(h["spec"]) if with_spec and h.get("spec") else None,
        )


class NodeRecord(msgspec.Struct):
    node_id: str
    state: str
    info: NodeInfo | None
    free_gpus: list[int]
    state_reason: str | None = None
    boot_id: str | None = None
    registered_at: float | None = None


async def get_job(store: Store, job_id: str) -> JobView | None:
    """The job as the projection holds it; None when the projection has not folded it."""
    jobs = await get_jobs(store, [job_id])
    return jobs[0] if jobs else None


async def get_jobs(store: Store, job_ids: list[str], with_spec: bool = True) -> list[JobView]:
    pipe = store.redis.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.hgetall(store.key("job", job_id))
    hashes = [(j, h) for j, h in zip(job_ids, await pipe.execute(), strict=True) if h.get("status")]
    why = await waiting.read(store, job_hash.decode_rows([j for j, _ in hashes], None, [h for _, h in hashes]))
    return [JobView.from_hash(j, h, with_spec, why.get(j)) for j, h in hashes]


class JobHead(msgspec.Struct):
    """The few fields a decider re-reads every cycle; the rest never change."""

    job_id: str
    status: str
    tenant: str
    order: int
    run_id: str | None
    last_seq: int
    attempt: int


async def job_heads(store: Store, job_ids: list[str]) -> list[JobHead]:
    pipe = store.redis.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.hmget(store.key("job", job_id), "status", "tenant", "order", "run_id", "last_seq", "attempt")
    rows = await pipe.execute()
    return [
        JobHead(job_id, status, tenant, int(order or 0), run_id or None, int(last_seq or 0), int(attempt or 0))
        for job_id, (status, tenant, order, run_id, last_seq, attempt) in zip(job_ids, rows, strict=True)
        if status is not None
    ]


async def job_specs(store: Store, job_ids: list[str]) -> dict[str, JobSpec]:
    pipe = store.redis.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.hget(store.key("job", job_id), "spec")
    return {j: _spec.decode(raw) for j, raw in zip(job_ids, await pipe.execute(), strict=True) if raw}


async def list_jobs(
    store: Store, tenant: str | None = None, status: str | None = None, limit: int = 100, newest_first: bool = True
) -> list[JobView]:
    index = store.key("tenant", tenant) if tenant else store.key("jobs")
    if status in ("pending", "admitted"):
        index = store.key(status)
    fetch = limit if status is None else max(limit * 10, 1000)
    if newest_first:
        ids = await store.redis.zrevrange(index, 0, fetch - 1)
    else:
        ids = await store.redis.zrange(index, 0, fetch - 1)
    jobs = await get_jobs(store, ids, with_spec=False)
    if tenant:
        jobs = [j for j in jobs if j.tenant == tenant]
    if status:
        jobs = [j for j in jobs if j.status == status]
    return jobs[:limit]


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
            node_id=info.node_id, state=state, info=info, free_gpus=free, state_reason=reason, boot_id=boot,
            registered_at=float(registered) if registered else None,
        )
        for (info, state, free), (reason, boot, registered) in zip(views, details, strict=True)
    ]


async def jobs_on_node(store: Store, node_id: str) -> list[str]:
    return sorted(await store.redis.smembers(store.key("noderuns", node_id)))


async def violations(store: Store) -> list[str]:
    return await store.redis.lrange(store.key("violations"), 0, -1)


# --- placement's reads and writes -------------------------------------------


class ActiveJob(msgspec.Struct):
    """An admitted, placed or running job as the placement cycle reads it."""

    job_id: str
    status: str
    tenant: str
    order: int
    run_id: str | None
    last_seq: int  # the job subject's last sequence, for Nats-Expected-Last-Subject-Sequence
    started_at: float | None
    placed_at: float | None
    preemptible: bool = False
    priority: int = 0
    last_checkpoint_at: float | None = None
    admitted_at: float | None = None  # when its current run was admitted (decision latency)


_ACTIVE_FIELDS = (
    "status", "tenant", "order", "run_id", "last_seq", "started_at", "placed_at",
    "preemptible", "priority", "last_checkpoint_at", "admitted_at",
)


def _float(raw: str | None) -> float | None:
    return float(raw) if raw else None


async def placement_state(
    store: Store, job_ids: list[str]
) -> tuple[list[tuple[NodeInfo, str, list[int]]], list[ActiveJob]]:
    """Every node as ``(info, state, free GPU indices)`` and the given jobs'
    heads, read in one transaction so the free GPUs and the runs holding GPUs
    describe the same moment of the projection."""
    pipe = store.redis.pipeline(transaction=True)
    pipe.hgetall(store.key("nodeinfo"))
    pipe.hgetall(store.key("nodestate"))
    pipe.hgetall(store.key("gpumap"))
    for job_id in job_ids:
        pipe.hmget(store.key("job", job_id), *_ACTIVE_FIELDS)
    infos, states, maps, *rows = await pipe.execute()
    nodes = []
    for node_id in sorted(infos):
        info = _node_info(infos[node_id])
        held = maps.get(node_id, "")
        free = [g for g in range(info.gpus) if g >= len(held) or held[g] != "#"]
        nodes.append((info, states.get(node_id, "unknown"), free))
    jobs = [
        ActiveJob(
            job_id=job_id, status=status, tenant=tenant or "", order=int(order or 0), run_id=run_id or None,
            last_seq=int(last_seq or 0), started_at=_float(started), placed_at=_float(placed),
            preemptible=(preemptible or "").lower() in ("1", "true", "yes"), priority=int(priority or 0),
            last_checkpoint_at=_float(checkpoint), admitted_at=_float(admitted),
        )
        for job_id, (status, tenant, order, run_id, last_seq, started, placed, preemptible, priority, checkpoint,
                     admitted) in zip(
            job_ids, rows, strict=True
        )
        if status is not None
    ]
    return nodes, jobs


async def run_placements(store: Store, job_ids: list[str]) -> dict[str, tuple[str, list[ReplicaPlacement]]]:
    """Each placed job's ``(current run id, replicas)``; jobs without a placement are left out."""
    pipe = store.redis.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.hmget(store.key("job", job_id), "run_id", "placement")
    out = {}
    for job_id, (run_id, raw) in zip(job_ids, await pipe.execute(), strict=True):
        if run_id and raw:
            out[job_id] = (run_id, _replicas.decode(raw))
    return out


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
    while the job is active.
    """

    def __init__(self, store: Store, cluster: str, policy: PlacementPolicy | None = None) -> None:
        self.store = store
        self.cluster = cluster
        self.policy = policy or PlacementPolicy()
        self.specs: dict[str, JobSpec] = {}  # job id -> spec, for every active job
        self.replicas: dict[str, list[ReplicaPlacement]] = {}  # run id -> where it runs

    async def read(self, job_ids: list[str]) -> tuple[ClusterSnapshot, dict[str, ActiveJob]]:
        """The cluster and the heads of the jobs among ``job_ids`` that hold or
        wait for GPUs (admitted, placed, running), from one consistent read."""
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

    async def _running(self, holding: list[ActiveJob]) -> list[RunningAlloc]:
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
                    job_id=j.job_id, run_id=j.run_id or "", replicas=replicas, started_at=started,
                    max_runtime_s=float(spec.max_runtime_s), preemptible=j.preemptible,
                    last_checkpoint_at=checkpoint, priority=j.priority,
                )
            )
        return out
