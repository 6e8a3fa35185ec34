"""Console pages for the fleet: the cluster map by topology (zone, block,
rack, node, GPU; coloured by tenant, or drawn by health), kept live, with
how many GPUs are schedulable, in use and in all.  Tenants' colours and
health's marks come from :mod:`trainyard_gateway.console.palette`; a node
links to its page only for the roles that may read it (see
:mod:`trainyard_gateway.console.nodes`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec
from fastapi import APIRouter, Request
from fastapi.responses import Response

from trainyard.auth import Action
from trainyard.bus import Bus
from trainyard.domain.node import SCHEDULABLE_STATES, NodeInfo
from trainyard.events.jobs import ReplicaPlacement
from trainyard.store import Store, views
from trainyard.store.caught_up import CaughtUpReads
from trainyard_gateway.console.live import Baselines, Events, stream
from trainyard_gateway.console.palette import HEALTH, Palette, tenancy_tenants
from trainyard_gateway.console.rebuilding import answers_rebuilding
from trainyard_gateway.console.render import fragment, may, page
from trainyard_gateway.console.session import principal, refusal

NODE_STATES = tuple(HEALTH)
SCHEDULABLE = frozenset(s.value for s in SCHEDULABLE_STATES)


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
    """Nodes per state, GPUs per tenant, and the GPUs that are schedulable (on
    nodes that take new work: healthy, not cordoned, draining or out of
    service), in use, free to schedule, and in all."""
    states: dict[str, int] = {}
    tenants: dict[str, int] = {}
    for tile in tiles:
        states[tile.state] = states.get(tile.state, 0) + 1
        for gpu in tile.gpus:
            if gpu.tenant:
                tenants[gpu.tenant] = tenants.get(gpu.tenant, 0) + 1
    takes_work = [t for t in tiles if t.state in SCHEDULABLE]
    schedulable = sum(len(t.gpus) for t in takes_work)
    return {
        "nodes": len(tiles),
        "gpus": sum(len(t.gpus) for t in tiles),
        "held": sum(t.held for t in tiles),
        "schedulable": schedulable,
        "free": schedulable - sum(t.held for t in takes_work),
        "states": {s: states[s] for s in sorted(states, key=state_order)},
        "tenants": dict(sorted(tenants.items())),
    }


def state_order(state: str) -> int:
    return NODE_STATES.index(state) if state in NODE_STATES else len(NODE_STATES)


def palette_for(order: Iterable[str], tiles: Iterable[NodeTile]) -> Palette:
    """The tenancy's tenants first, then any other tenant holding a GPU."""
    return Palette(order, (g.tenant for t in tiles for g in t.gpus if g.tenant))


#: The key of a map's view under which its palette is kept (no node id is empty).
PALETTE = ""


def view_of(tiles: Iterable[NodeTile], palette: Palette) -> dict[str, str]:
    """What a map shows: each node's signature, and the palette it is drawn
    with (a tenant outside the tenancy that sorts first recolours the others)."""
    view = {t.info.node_id: t.signature() for t in tiles}
    view[PALETTE] = ",".join(f"{name}={sw.colour}/{sw.pattern}" for name, sw in palette.swatches.items())
    return view


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
        palette = palette_for(await tenancy_tenants(bus), tiles)
        view = baselines.keep(view_of(tiles, palette))
        counts = summary(tiles)
        return page(
            request,
            "cluster.html",
            who,
            tree=topology(tiles),
            summary=counts,
            view=view,
            colour="health" if colour == "health" else "tenant",
            health=HEALTH,
            palette=palette,
            link=may(who, Action.NODE_HISTORY),
        )

    @router.get("/cluster/stream")
    async def cluster_stream(request: Request, view: str = "") -> Response:
        who = principal(request)
        if (refused := refusal(request, who, Action.NODE_LIST)) is not None:
            return refused
        shown = baselines.take(view)
        reader = FleetReader(store, caught_up)
        order = await tenancy_tenants(bus)
        link = may(who, Action.NODE_HISTORY)

        async def poll() -> Events:
            nonlocal shown
            tiles = await reader.tiles()
            palette = palette_for(order, tiles)
            now = view_of(tiles, palette)
            before, shown = shown, now
            numbers = summary(tiles)
            counts = [
                ("cluster-summary", fragment("_cluster_summary.html", summary=numbers)),
                ("tenant-legend", fragment("_tenant_legend.html", summary=numbers, palette=palette)),
            ]
            if before is None or before.keys() != now.keys() or before[PALETTE] != now[PALETTE]:
                whole = fragment("_cluster_map.html", tree=topology(tiles), palette=palette, link=link)
                return [("cluster-map", whole), *counts]
            changed = [t for t in tiles if before[t.info.node_id] != now[t.info.node_id]]
            if not changed:
                return []
            tile_events = [
                (f"node-{t.info.node_id}", fragment("_node_tile.html", tile=t, palette=palette, link=link))
                for t in changed
            ]
            return [*tile_events, *counts]

        return stream(request, poll)

    return router
