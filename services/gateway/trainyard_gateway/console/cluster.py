"""Console pages for the fleet: the cluster map by topology (zone, block,
rack, node, GPU; coloured by tenant or by health), kept live, and a node's
detail with its health history and the cordon / drain / uncordon commands
(operators and admins, as in the API)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import urlencode

import msgspec
from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from trainyard.auth import Action, PermissionDenied, authorize
from trainyard.bus import Bus
from trainyard.domain.node import NodeInfo
from trainyard.events.jobs import ReplicaPlacement
from trainyard.store import Store, views
from trainyard.store.caught_up import CaughtUpReads
from trainyard_gateway.console.live import Baselines, Events, stream
from trainyard_gateway.console.rebuilding import answers_rebuilding
from trainyard_gateway.console.render import fragment, page
from trainyard_gateway.console.session import Forbidden, principal, read_form, refusal
from trainyard_gateway.nodes_api import MAX_REASON_CHARS, NODE_ID_RE, NodeCommandRefused, health_record, node_command

NODE_STATES = ("healthy", "suspect", "cordoned", "draining", "repair", "lost")


class Gpu(msgspec.Struct):
    index: int
    job_id: str | None = None
    tenant: str | None = None


class NodeTile(msgspec.Struct):
    info: NodeInfo
    state: str
    gpus: list[Gpu]

    @property
    def held(self) -> int:
        return sum(1 for g in self.gpus if g.job_id)

    def signature(self) -> str:
        return self.state + "|" + ",".join(g.job_id or "" for g in self.gpus)


class FleetReader:
    """The fleet as the map draws it: every node with its state and, per GPU,
    the job (and tenant) holding it.  A run's replicas never change, so each is
    decoded once and kept while the run holds GPUs.  It reads the NODES and
    JOBS projections only once both are caught up (``caught_up``): while one is
    rebuilt it raises ``ProjectionRebuilding`` rather than draw a part of the fleet."""

    def __init__(self, store: Store, caught_up: CaughtUpReads) -> None:
        self.store = store
        self.caught_up = caught_up
        self.placements: dict[str, tuple[str, list[ReplicaPlacement]]] = {}  # run id -> (tenant, replicas)

    async def tiles(self, only: str | None = None) -> list[NodeTile]:
        """Every node's tile, or only the tile of node ``only``."""
        return await self.caught_up.read(lambda: self._tiles(only))

    async def _tiles(self, only: str | None) -> list[NodeTile]:
        nodes = [n for n in await views.node_views(self.store) if only is None or n[0].node_id == only]
        pipe = self.store.redis.pipeline(transaction=False)
        for info, _, _ in nodes:
            pipe.smembers(self.store.key("noderuns", info.node_id))
        job_ids = sorted({j for members in await pipe.execute() for j in members})
        holding = {
            j.job_id: (j.run_id, j.tenant)
            for j in await views.get_jobs(self.store, job_ids, ("run_id",))
            if j.run_id and j.status in views.HOLDING
        }
        missing = [j for j, (run, _) in holding.items() if run not in self.placements]
        if missing:
            for job_id, (_, replicas) in (await views.run_placements(self.store, missing)).items():
                run, tenant = holding[job_id]
                self.placements[run] = (tenant, replicas)
        current = {run for run, _ in holding.values()}
        for run in [r for r in self.placements if r not in current]:
            del self.placements[run]
        owner: dict[tuple[str, int], tuple[str, str]] = {}
        for job_id, (run, _) in holding.items():
            tenant, replicas = self.placements.get(run, ("", []))
            for replica in replicas:
                for gpu in replica.gpus:
                    owner[(replica.node_id, gpu)] = (job_id, tenant)
        tiles = []
        for info, state, free in nodes:
            free_set = set(free)
            gpus = []
            for g in range(info.gpus):
                job_id, tenant = owner.get((info.node_id, g), (None, None))
                if job_id is None and g not in free_set:
                    job_id = "?"  # held, by a run the map has not read yet
                gpus.append(Gpu(g, job_id, tenant))
            tiles.append(NodeTile(info, state, gpus))
        return tiles


def topology(tiles: Iterable[NodeTile]) -> list[tuple[str, list[tuple[str, list[tuple[str, list[NodeTile]]]]]]]:
    """Nodes grouped zone -> block -> rack, each level sorted."""
    tree: dict[str, dict[str, dict[str, list[NodeTile]]]] = {}
    for tile in tiles:
        tree.setdefault(tile.info.zone, {}).setdefault(tile.info.block, {}).setdefault(tile.info.rack, []).append(tile)
    return [
        (
            zone,
            [
                (block, [(rack, tree[zone][block][rack]) for rack in sorted(tree[zone][block])])
                for block in sorted(tree[zone])
            ],
        )
        for zone in sorted(tree)
    ]


def summary(tiles: list[NodeTile]) -> dict[str, Any]:
    states: dict[str, int] = {}
    tenants: dict[str, int] = {}
    for tile in tiles:
        states[tile.state] = states.get(tile.state, 0) + 1
        for gpu in tile.gpus:
            if gpu.tenant:
                tenants[gpu.tenant] = tenants.get(gpu.tenant, 0) + 1
    gpus = sum(len(t.gpus) for t in tiles)
    held = sum(t.held for t in tiles)
    return {"nodes": len(tiles), "gpus": gpus, "held": held, "states": states, "tenants": dict(sorted(tenants.items()))}


def build_router(bus: Bus, store: Store) -> APIRouter:
    router = APIRouter(include_in_schema=False)
    baselines = Baselines()
    caught_up = CaughtUpReads(bus, store, streams=("NODES", "JOBS"))

    @router.get("/cluster")
    @answers_rebuilding
    async def cluster_page(request: Request, colour: str = "tenant") -> Response:
        who = principal(request)
        if (refused := refusal(request, who, Action.NODE_LIST)) is not None:
            return refused
        tiles = await FleetReader(store, caught_up).tiles()
        view = baselines.keep({t.info.node_id: t.signature() for t in tiles})
        return page(
            request,
            "cluster.html",
            who,
            tree=topology(tiles),
            summary=summary(tiles),
            view=view,
            colour="health" if colour == "health" else "tenant",
            states=NODE_STATES,
        )

    @router.get("/cluster/stream")
    async def cluster_stream(request: Request, view: str = "") -> Response:
        who = principal(request)
        if (refused := refusal(request, who, Action.NODE_LIST)) is not None:
            return refused
        shown = baselines.take(view)
        reader = FleetReader(store, caught_up)

        async def poll() -> Events:
            nonlocal shown
            tiles = await reader.tiles()
            now = {t.info.node_id: t.signature() for t in tiles}
            before, shown = shown, now
            if before is None or before.keys() != now.keys():
                return [
                    ("cluster-map", fragment("_cluster_map.html", tree=topology(tiles))),
                    ("cluster-summary", fragment("_cluster_summary.html", summary=summary(tiles))),
                ]
            changed = [t for t in tiles if before[t.info.node_id] != now[t.info.node_id]]
            if not changed:
                return []
            return [(f"node-{t.info.node_id}", fragment("_node_tile.html", tile=t)) for t in changed] + [
                ("cluster-summary", fragment("_cluster_summary.html", summary=summary(tiles)))
            ]

        return stream(request, poll)

    @router.get("/nodes/{node_id}")
    @answers_rebuilding
    async def node_page(request: Request, node_id: str, done: str = "", error: str = "") -> Response:
        who = principal(request)
        if (refused := refusal(request, who, Action.NODE_HISTORY)) is not None:
            return refused
        record = await caught_up.read(lambda: health_record(store, node_id)) if NODE_ID_RE.fullmatch(node_id) else None
        if record is None:
            return page(request, "error.html", who, status_code=404, message=f"no node {node_id!r}")
        tile = next(iter(await FleetReader(store, caught_up).tiles(only=node_id)), None)
        runs = await caught_up.read(lambda: views.jobs_on_node(store, node_id))
        return page(
            request,
            "node.html",
            who,
            node_id=node_id,
            record=record,
            tile=tile,
            runs=runs,
            done=done[:300],
            error=error[:300],
            history=list(reversed(record.history)),
        )

    @router.post("/nodes/{node_id}/{op}")
    async def node_op(request: Request, node_id: str, op: str) -> Response:
        who = principal(request)
        if op not in ("cordon", "drain", "uncordon") or not NODE_ID_RE.fullmatch(node_id):
            return page(request, "error.html", who, status_code=404, message="no such page")
        try:
            fields = await read_form(request)
            authorize(who, Action.NODE_OPERATE)
        except (Forbidden, PermissionDenied) as err:
            return page(request, "error.html", who, status_code=403, message=str(err))
        reason = fields.get("reason", "").strip()
        if not 0 < len(reason) <= MAX_REASON_CHARS:
            problem = f"give a reason (1-{MAX_REASON_CHARS} characters)"
            return RedirectResponse(f"/nodes/{node_id}?{urlencode({'error': problem})}", 303)
        try:
            accepted = await node_command(bus, store, op, node_id, reason, who)
        except NodeCommandRefused as err:
            return page(request, "error.html", who, status_code=err.status, message=str(err))
        message = f"{op} accepted: {node_id} goes from {accepted.state} to {accepted.expected_state}"
        return RedirectResponse(f"/nodes/{node_id}?{urlencode({'done': message})}", 303)

    return router
