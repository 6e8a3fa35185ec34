"""Prometheus metrics of the services, each served by its own process.

``TRAINYARD_<SERVICE>_METRICS_PORT`` names the port of a service's metrics
(unset or 0: not served) and ``TRAINYARD_<SERVICE>_METRICS_ADDR`` the address
(default 127.0.0.1; empty: every interface), both read with the other
settings (:meth:`trainyard.settings.Settings.metrics_endpoint`).  The gateway serves its own
on the REST API's ``/metrics``.  Each metrics object has its own registry, so
tests and an embedded stack can build several in one process.

docs/operations.md lists every metric; deploy/prometheus/alerts.yml and
deploy/grafana/trainyard.json use only these (a test checks).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence

import nats.errors
import nats.js.errors
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from redis.exceptions import RedisError

from trainyard.bus import Bus
from trainyard.settings import Settings
from trainyard.store import Projector

log = logging.getLogger(__name__)

#: Seconds: cycles and decisions take milliseconds when all is well, minutes when not.
CYCLE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0)
#: How often the gauges read from NATS (projection and ledger lag) are refreshed.
REFRESH_S = 5.0


def serve_metrics(service: str, registry: CollectorRegistry, settings: Settings) -> int:
    """Serve ``registry`` on the service's configured port; returns it (0: not served)."""
    addr, port = settings.metrics_endpoint(service)
    if port:
        try:
            start_http_server(port, addr=addr, registry=registry)
        except OSError as err:
            raise SystemExit(
                f"{service}: cannot serve metrics on {addr}:{port}: {err.strerror} "
                f"(set TRAINYARD_{service.upper()}_METRICS_PORT to a free port, or 0 for none)"
            ) from err
        log.info("%s metrics on %s:%d/metrics", service, addr, port)
    return port


class DeciderMetrics:
    """What every single-leader decider (admission, placement) exports."""

    def __init__(self, name: str, decisions: Iterable[str], stage: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.name = name
        self.stage = stage  # the decision-latency stage this decider ends
        self.cycle_seconds = Histogram(
            f"trainyard_{name}_cycle_seconds",
            f"Time of one {name} cycle: snapshot, decide, publish, read back.",
            buckets=CYCLE_BUCKETS,
            registry=self.registry,
        )
        self.last_cycle = Gauge(
            f"trainyard_{name}_last_cycle_timestamp_seconds",
            f"When the last {name} cycle of this process ended.",
            registry=self.registry,
        )
        self.leader = Gauge(
            f"trainyard_{name}_leader", f"1 while this process holds the {name} lease.", registry=self.registry
        )
        self.decisions = Counter(
            f"trainyard_{name}_decisions", f"Decisions {name} published, by kind.", ["decision"], registry=self.registry
        )
        for decision in decisions:
            self.decisions.labels(decision)
        self.latency = Histogram(
            "trainyard_decision_latency_seconds",
            "From one step of a job to the next: submitted -> admitted (admission), admitted -> placed (placement).",
            ["stage"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.latency.labels(stage)

    def cycle_done(self, seconds: float) -> None:
        self.cycle_seconds.observe(seconds)
        self.last_cycle.set(time.time())

    def decided(self, decision: str, count: int = 1) -> None:
        if count:
            self.decisions.labels(decision).inc(count)

    def waited(self, seconds: Iterable[float]) -> None:
        for s in seconds:
            self.latency.labels(self.stage).observe(max(0.0, s))


class AdmissionMetrics(DeciderMetrics):
    def __init__(self) -> None:
        super().__init__(
            "admission",
            ("accepted", "rejected", "cancelled", "admitted", "preempted", "stopped"),
            "submitted_to_admitted",
        )
        self.pending_jobs = Gauge(
            "trainyard_queue_pending_jobs",
            "Jobs waiting for admission, by tenant and queue.",
            ["tenant", "queue"],
            registry=self.registry,
        )
        self.pending_gpus = Gauge(
            "trainyard_queue_pending_gpus",
            "GPUs the pending jobs ask for, by tenant and queue.",
            ["tenant", "queue"],
            registry=self.registry,
        )
        self._queues: set[tuple[str, str]] = set()

    def set_queues(self, depth: dict[tuple[str, str], tuple[int, int]]) -> None:
        """Pending (jobs, GPUs) per (tenant, queue); a queue that emptied reads 0."""
        for key in self._queues - depth.keys():
            self.pending_jobs.labels(*key).set(0)
            self.pending_gpus.labels(*key).set(0)
        for key, (jobs, gpus) in depth.items():
            self.pending_jobs.labels(*key).set(jobs)
            self.pending_gpus.labels(*key).set(gpus)
        self._queues |= depth.keys()


class PlacementMetrics(DeciderMetrics):
    def __init__(self) -> None:
        super().__init__("placement", ("placed", "backfilled", "conflict", "dropped"), "admitted_to_placed")
        self.waiting = Gauge(
            "trainyard_placement_waiting_jobs", "Admitted jobs not placed yet.", registry=self.registry
        )
        self.reservations = Gauge(
            "trainyard_placement_reservations", "Gangs holding a backfill reservation.", registry=self.registry
        )


class ProjectionMetrics:
    """How far this process's projections are behind their streams, and how
    often they were rebuilt (Redis lost them)."""

    def __init__(self, registry: CollectorRegistry, projectors: Sequence[Projector]) -> None:
        self.projectors = list(projectors)
        self.lag = Gauge(
            "trainyard_projection_lag_events",
            "Stream head minus the projection's applied sequence.",
            ["stream"],
            registry=registry,
        )
        self.rebuilds = Counter(
            "trainyard_projection_rebuilds",
            "Times this process found the projection lost and rebuilt it from the stream.",
            ["stream"],
            registry=registry,
        )
        self._counted = [0] * len(self.projectors)  # lost_count already counted, per projector
        for p in self.projectors:
            self.lag.labels(p.stream).set(0)
            self.rebuilds.labels(p.stream)

    async def refresh(self, bus: Bus) -> None:
        for i, p in enumerate(self.projectors):
            head = (await bus.js.stream_info(p.stream)).state.last_seq
            self.lag.labels(p.stream).set(max(0, head - p.position))
            if p.lost_count > self._counted[i]:
                self.rebuilds.labels(p.stream).inc(p.lost_count - self._counted[i])
                self._counted[i] = p.lost_count


class LedgerMetrics:
    """How far the accounting ledger is behind the JOBS stream."""

    def __init__(self, durable: str = "accounting", stream: str = "JOBS") -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.durable = durable
        self.stream = stream
        self.lag_events = Gauge(
            "trainyard_ledger_lag_events",
            "JOBS stream head minus the last sequence the ledger has applied (and acknowledged).",
            registry=self.registry,
        )
        self.lag_seconds = Gauge(
            "trainyard_ledger_lag_seconds",
            "Age of the oldest JOBS event the ledger has not applied yet (0 when caught up).",
            registry=self.registry,
        )
        self.applied_seq = Gauge(
            "trainyard_ledger_applied_sequence",
            "The JOBS sequence through which the ledger has applied every event.",
            registry=self.registry,
        )
        self.metered = Counter(
            "trainyard_ledger_runs_metered",
            "Runs whose end the ledger metered, by outcome.",
            ["outcome"],
            registry=self.registry,
        )

    async def refresh(self, bus: Bus, now: Callable[[], float] = time.time) -> None:
        head = (await bus.js.stream_info(self.stream)).state.last_seq
        try:
            floor = (await bus.js.consumer_info(self.stream, self.durable)).ack_floor.stream_seq or 0
        except nats.js.errors.NotFoundError:  # accounting has not made its consumer yet
            floor = 0
        self.applied_seq.set(floor)
        behind = max(0, head - floor)
        self.lag_events.set(behind)
        age = 0.0
        if behind:
            try:
                oldest = await bus.js.get_msg(self.stream, floor + 1)
                age = max(0.0, now() - oldest.time.timestamp()) if oldest.time else 0.0
            except nats.js.errors.NotFoundError:  # aged out of the stream: nothing to date it by
                age = 0.0
        self.lag_seconds.set(age)


async def refresh_every(stop: asyncio.Event, refresh: Callable[[], object], interval: float = REFRESH_S) -> None:
    """Call ``refresh()`` (a coroutine function) every ``interval`` until ``stop``; a failure is logged and retried."""
    while not stop.is_set():
        try:
            await refresh()  # type: ignore[misc]
        except (TimeoutError, nats.errors.Error, OSError, RedisError) as err:
            log.debug("metrics refresh failed: %r", err)
        try:
            await asyncio.wait_for(stop.wait(), interval)
        except TimeoutError:
            pass
