"""Composition root of the health service."""

from __future__ import annotations

import json
import logging
import os
import time

import msgspec

from trainyard.bus import ConsumerSpec, run_consumer
from trainyard.core.health import DEFAULT_POLICY, HealthPolicy
from trainyard.events import subjects
from trainyard.runtime import Runtime, run_tasks, serve
from trainyard.settings import ConfigurationError
from trainyard.store import Projector
from trainyard_health.handlers import NodeEventsHandler, TelemetryHandler
from trainyard_health.liveness import HEARTBEAT_DURABLE, LivenessCheck, liveness_loop
from trainyard_health.metrics import HealthMetrics
from trainyard_health.monitor import Monitor, StateHook
from trainyard_health.repair import RepairLoop

log = logging.getLogger(__name__)

POLICY_VARIABLE = "TRAINYARD_HEALTH_POLICY"  # JSON object of HealthPolicy fields to override
KUBE_VARIABLE = "TRAINYARD_HEALTH_KUBE_TAINTS"  # "1": cordon and taint Kubernetes nodes too


def load_policy(environ: dict[str, str] | None = None) -> HealthPolicy:
    env = os.environ if environ is None else environ
    raw = env.get(POLICY_VARIABLE)
    if not raw:
        return DEFAULT_POLICY
    try:
        overrides = json.loads(raw)
        return msgspec.convert({**msgspec.to_builtins(DEFAULT_POLICY), **overrides}, HealthPolicy)
    except (ValueError, msgspec.ValidationError) as err:
        raise ConfigurationError(f"{POLICY_VARIABLE} is not a valid health policy: {err}") from err


def kube_hook(environ: dict[str, str] | None = None) -> StateHook | None:
    env = os.environ if environ is None else environ
    if env.get(KUBE_VARIABLE) != "1":
        return None
    from trainyard.kube.taints import KubeNodeTainter

    return KubeNodeTainter().on_state_changed


async def liveness_after_nodes(rt: Runtime, check: LivenessCheck, nodes: Projector) -> None:
    await nodes.wait_for(await rt.store.last_seq("nodes"))
    await liveness_loop(check, rt.stop, rt.settings.heartbeat_interval_s / 2)


async def main(rt: Runtime) -> None:
    policy = load_policy()
    metrics = HealthMetrics()
    port = metrics.serve()
    if port:
        log.info("health metrics on :%d/metrics", port)
    nodes = Projector(rt.bus, rt.store, "NODES")
    monitor = Monitor(rt.bus, rt.store, policy, time.time, metrics=metrics, nodes=nodes, hook=kube_hook())
    telemetry = ConsumerSpec(
        stream="TELEMETRY", durable=HEARTBEAT_DURABLE, filter_subject=subjects.TELEMETRY_ALL, ack_wait_s=10.0
    )
    node_events = ConsumerSpec(stream="NODES", durable="health-nodes", filter_subject=subjects.NODES_ALL, ack_wait_s=10.0)
    check = LivenessCheck(
        rt.bus, rt.store, monitor, rt.settings.heartbeat_timeout_s, time.time,
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
