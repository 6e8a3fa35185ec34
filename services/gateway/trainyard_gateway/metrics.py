"""Prometheus metrics of the gateway: fleet and job gauges read from the
projections at scrape time, and counters of the requests it served.

The gauges come from caught-up projections only: while one is rebuilt
(Redis wiped or restarted empty) a scrape exports the last caught-up
snapshot with ``trainyard_projection_rebuilding 1`` (and answers 503 when it
has none yet), so the job counts never drop to a half-rebuilt view.

Each :class:`GatewayMetrics` has its own registry, so two gateways in one
process (tests, an embedded stack) never share or clash on metrics.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Awaitable, Callable, Iterator

import msgspec
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from trainyard.domain.node import NodeState
from trainyard.store import Store, views
from trainyard.store.caught_up import CaughtUpReads, ProjectionRebuilding

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: Every status a job can have in the projection; each is exported, zero or not.
JOB_STATUSES = ("pending", "admitted", "placed", "running", "succeeded", "failed", "cancelled", "rejected")


class FleetSnapshot(msgspec.Struct):
    """What one scrape read from Redis."""

    jobs_by_status: dict[str, int] = {}
    gpus_capacity: dict[str, int] = {}  # schedulable GPUs per GPU type
    gpus_in_use: dict[str, int] = {}  # GPUs held by active runs per GPU type
    nodes_by_state: dict[str, int] = {}
    deadletters: dict[str, int] = {}  # dead letters in the DEADLETTER stream, by the stream they came from
    rebuilding: bool = False  # a projection is being rebuilt: the gauges above are its last caught-up view


async def read_snapshot(store: Store) -> FleetSnapshot:
    counts = await views.status_counts(store)
    nodes = Tally(record.state for record in await views.list_nodes(store))
    return FleetSnapshot(
        jobs_by_status={**dict.fromkeys(JOB_STATUSES, 0), **counts},
        gpus_capacity=await views.gpus_by_type(store, "capacity"),
        gpus_in_use=await views.gpus_by_type(store, "inuse"),
        nodes_by_state={**{s.value: 0 for s in NodeState}, **nodes},
    )


class _SnapshotCollector(Collector):
    """Exports the latest snapshot; the scrape handler refreshes it just
    before rendering, with no await in between."""

    def __init__(self) -> None:
        self.snapshot = FleetSnapshot()

    def collect(self) -> Iterator[Metric]:
        s = self.snapshot
        jobs = GaugeMetricFamily("trainyard_jobs", "Jobs in the projection by status.", labels=["status"])
        for status, n in sorted(s.jobs_by_status.items()):
            jobs.add_metric([status], n)
        capacity = GaugeMetricFamily("trainyard_gpus_capacity", "Schedulable GPUs by GPU type.", labels=["gpu_type"])
        for gpu_type, n in sorted(s.gpus_capacity.items()):
            capacity.add_metric([gpu_type], n)
        in_use = GaugeMetricFamily(
            "trainyard_gpus_in_use", "GPUs held by active runs by GPU type.", labels=["gpu_type"]
        )
        for gpu_type, n in sorted(s.gpus_in_use.items()):
            in_use.add_metric([gpu_type], n)
        nodes = GaugeMetricFamily("trainyard_nodes", "Nodes by state.", labels=["state"])
        for state, n in sorted(s.nodes_by_state.items()):
            nodes.add_metric([state], n)
        rebuilding = GaugeMetricFamily(
            "trainyard_projection_rebuilding",
            "1 while a projection is rebuilt: the job and node gauges are then its last caught-up view.",
        )
        rebuilding.add_metric([], int(s.rebuilding))
        yield from (jobs, capacity, in_use, nodes, rebuilding)
        if s.deadletters:
            dead = GaugeMetricFamily(
                "trainyard_deadletters",
                "Dead letters kept in the DEADLETTER stream, by the stream they came from.",
                labels=["stream"],
            )
            for stream, n in sorted(s.deadletters.items()):
                dead.add_metric([stream], n)
            yield dead


class GatewayMetrics:
    """``deadletters``: reads how many dead letters each stream has (the
    gateway passes :func:`trainyard.bus.deadletters.counts`); None: not exported.
    ``caught_up``: reads the projections only once they hold their streams'
    heads; None: as they are (a test without a bus)."""

    def __init__(
        self, deadletters: Callable[[], Awaitable[dict[str, int]]] | None = None, caught_up: CaughtUpReads | None = None
    ) -> None:
        self.deadletters = deadletters
        self.caught_up = caught_up
        self._last: FleetSnapshot | None = None  # the last snapshot read from caught-up projections
        self.registry = CollectorRegistry(auto_describe=False)
        self._fleet = _SnapshotCollector()
        self.registry.register(self._fleet)
        self.http_requests = Counter(
            "trainyard_gateway_http_requests",
            "REST requests served, by method, route template and HTTP status.",
            ["method", "route", "code"],
            registry=self.registry,
        )
        self.grpc_requests = Counter(
            "trainyard_gateway_grpc_requests",
            "gRPC calls served, by method and status code.",
            ["method", "code"],
            registry=self.registry,
        )

    async def render(self, store: Store) -> bytes:
        snapshot = await self._read(store)
        if self.deadletters is not None:
            snapshot.deadletters = await self.deadletters()
        self._fleet.snapshot = snapshot
        return generate_latest(self.registry)

    async def _read(self, store: Store) -> FleetSnapshot:
        if self.caught_up is None:
            return await read_snapshot(store)
        try:
            self._last = await self.caught_up.read(lambda: read_snapshot(store))
            return self._last
        except ProjectionRebuilding:
            if self._last is None:
                raise  # nothing caught up to show yet: 503
            return msgspec.structs.replace(self._last, rebuilding=True)
