"""Composition root of the health service."""

from __future__ import annotations

import json
import logging
import time

import msgspec

from trainyard.bus import ConsumerSpec, run_consumer
from trainyard.core.health import DEFAULT_POLICY, HealthPolicy
from trainyard.events import subjects
from trainyard.runtime import Runtime, run_tasks, serve
from trainyard.settings import ConfigurationError, Settings, variable
from trainyard.store import Projector
from trainyard_health.handlers import NodeEventsHandler, TelemetryHandler
from trainyard_health.liveness import HEARTBEAT_DURABLE, LivenessCheck, liveness_loop
from trainyard_health.metrics import HealthMetrics
from trainyard_health.monitor import Monitor, StateHook
from trainyard_health.repair import RepairLoop

log = logging.getLogger(__name__)

#: The heartbeat consumer fetches at most this often (``ConsumerSpec.linger_s``),
#: taking what gathered meanwhile in one go: a heartbeat or fault is handled at
#: most this much later (the first after a quiet spell at once), against a
#: heartbeat timeout of seconds.
HEARTBEAT_LINGER_S = 0.1


def load_policy(settings: Settings) -> HealthPolicy:
    """The default policy with the fields ``TRAINYARD_HEALTH_POLICY`` overrides."""
    if not settings.health_policy:
        return DEFAULT_POLICY
    try:
        overrides = json.loads(settings.health_policy)
        return msgspec.convert({**msgspec.to_builtins(DEFAULT_POLICY), **overrides}, HealthPolicy)
    except (ValueError, msgspec.ValidationError) as err:
        raise ConfigurationError(f"{variable('health_policy')} is not a valid health policy: {err}") from err


def kube_hook(settings: Settings) -> StateHook | None:
    """Cordon and taint the Kubernetes nodes too, when ``TRAINYARD_HEALTH_KUBE_TAINTS`` is 1."""
    if settings.health_kube_taints != "1":
        return None
    from trainyard.kube.taints import KubeNodeTainter

    return KubeNodeTainter().on_state_changed


async def liveness_after_nodes(rt: Runtime, check: LivenessCheck, nodes: Projector) -> None:
    await nodes.wait_for(await rt.store.last_seq("nodes"))
    await liveness_loop(check, rt.stop, rt.settings.heartbeat_interval_s / 2)


async def main(rt: Runtime) -> None:
    policy = load_policy(rt.settings)
    metrics = HealthMetrics()
    port = metrics.serve(rt.settings)
    if port:
        log.info("health metrics on :%d/metrics", port)
    nodes = Projector(rt.bus, rt.store, "NODES")
    monitor = Monitor(rt.bus, rt.store, policy, time.time, metrics=metrics, nodes=nodes, hook=kube_hook(rt.settings))
    telemetry = ConsumerSpec(
        stream="TELEMETRY",
        durable=HEARTBEAT_DURABLE,
        filter_subject=subjects.TELEMETRY_ALL,
        ack_wait_s=10.0,
        linger_s=HEARTBEAT_LINGER_S,
    )
    node_events = ConsumerSpec(
        stream="NODES", durable="health-nodes", filter_subject=subjects.NODES_ALL, ack_wait_s=10.0
    )
    check = LivenessCheck(
        rt.bus,
        rt.store,
        monitor,
        rt.settings.heartbeat_timeout_s,
        time.time,
        catch_up_wait_s=max(1.0, rt.settings.heartbeat_interval_s),
    )
    await run_tasks(
        rt.stop,
        nodes.run(rt.stop),
        run_consumer(rt.bus, telemetry, TelemetryHandler(monitor, time.time), rt.stop),
        run_consumer(rt.bus, node_events, NodeEventsHandler(monitor, time.time), rt.stop),
        liveness_after_nodes(rt, check, nodes),
        RepairLoop(monitor).run(rt.stop),
    )


def run() -> None:
    serve("health", main)
