"""Prometheus metrics of fleet health, served by the health process itself.

``TRAINYARD_HEALTH_METRICS_PORT`` names the port (unset or 0: not served).
Each ``HealthMetrics`` has its own registry, so tests can build several.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from trainyard.domain.node import NodeState
from trainyard.observability.metrics import serve_metrics
from trainyard.settings import Settings


class HealthMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.nodes = Gauge(
            "trainyard_health_nodes", "Nodes by health state (health's records).", ["state"], registry=self.registry
        )
        self.xids = Counter(
            "trainyard_health_xids", "XIDs reported by agents, by XID code.", ["xid"], registry=self.registry
        )
        self.findings = Counter(
            "trainyard_health_findings", "Findings by kind and severity.", ["kind", "severity"], registry=self.registry
        )
        self.transitions = Counter(
            "trainyard_health_transitions",
            "Node state changes, by new state and who decided.",
            ["state", "by"],
            registry=self.registry,
        )
        self.alerts = Counter(
            "trainyard_health_alerts", "Alerts raised, by severity.", ["severity"], registry=self.registry
        )
        self.held = Counter(
            "trainyard_health_blast_radius_held",
            "Isolations held back by the blast-radius limit.",
            registry=self.registry,
        )
        self.rack_faults = Counter(
            "trainyard_health_rack_faults", "Suspected rack faults raised.", registry=self.registry
        )
        self.runs_failed = Counter(
            "trainyard_health_runs_failed",
            "Runs failed or preempted off unhealthy nodes.",
            ["reason"],
            registry=self.registry,
        )
        self.time_to_isolate = Histogram(
            "trainyard_health_time_to_isolate_seconds",
            "From the fault's observation on the node to the node taken out of service (state change stored).",
            buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0),
            registry=self.registry,
        )
        for state in NodeState:
            self.nodes.labels(state.value).set(0)

    def set_node_states(self, counts: dict[str, int]) -> None:
        for state in NodeState:
            self.nodes.labels(state.value).set(counts.get(state.value, 0))

    def serve(self, settings: Settings) -> int:
        """Serve on ``TRAINYARD_HEALTH_METRICS_PORT``; returns it (0: not served)."""
        return serve_metrics("health", self.registry, settings)
