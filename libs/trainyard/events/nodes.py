"""Node lifecycle messages, subject trainyard.nodes.<cluster>.<node_id>;
heartbeats, GPU samples and XIDs go to trainyard.telemetry.<cluster>.<node_id>.

NODES carries registrations, state changes (decided by the health service)
and operator commands (``CordonNode``, ``DrainNode``, ``UncordonNode``, which
the health service turns into state changes).  TELEMETRY carries what agents
observe: ``NodeHeartbeat``, ``GpuTelemetry`` and ``XidObserved``.
"""

from __future__ import annotations

import msgspec

from trainyard.domain.node import NodeInfo
from trainyard.domain.telemetry import NodeSample, XidEvent


class _NodeMessage(msgspec.Struct, tag_field="type", kw_only=True, frozen=True):
    at: float


class NodeRegistered(_NodeMessage, tag="NodeRegistered", frozen=True):
    node: NodeInfo
    boot_id: str  # changes when the agent restarts; fences heartbeats of older boots


class NodeHeartbeat(_NodeMessage, tag="NodeHeartbeat", frozen=True):
    node_id: str
    cluster: str
    boot_id: str
    running_runs: list[str] = []


class NodeLost(_NodeMessage, tag="NodeLost", frozen=True):
    node_id: str
    cluster: str
    boot_id: str  # the boot that went silent; a newer boot is not lost
    last_heartbeat_at: float
    reason: str = "no heartbeat"


# --- telemetry from agents (TELEMETRY stream) ---


class GpuTelemetry(_NodeMessage, tag="GpuTelemetry", frozen=True):
    """A periodic reading of every GPU of a node."""

    node_id: str
    cluster: str
    boot_id: str
    sample: NodeSample


class XidObserved(_NodeMessage, tag="XidObserved", frozen=True):
    """XIDs the driver reported, published as soon as they are seen."""

    node_id: str
    cluster: str
    boot_id: str
    events: list[XidEvent]


# --- state changes decided by the health service (NODES stream) ---


class NodeStateChanged(_NodeMessage, tag="NodeStateChanged", frozen=True):
    """The node moved to ``state`` (healthy, suspect, cordoned, draining, repair, lost).

    Only ``healthy`` nodes take new work; the projection keeps ``capacity``
    and ``nodestate`` in step with this event."""

    node_id: str
    cluster: str
    state: str
    previous: str
    reason: str
    cause: str = ""  # the finding kind or command that caused it
    by: str = "automation"  # "automation" or "operator:<name>"
    observed_at: float | None = None  # when the fault that caused it was observed
    fatal: bool = False  # isolated for a fatal fault (Kubernetes: NoExecute taint)


# --- operator commands (NODES stream), carried out by the health service ---


class CordonNode(_NodeMessage, tag="CordonNode", frozen=True):
    node_id: str
    cluster: str
    by: str  # "operator:<name>"
    reason: str


class DrainNode(_NodeMessage, tag="DrainNode", frozen=True):
    node_id: str
    cluster: str
    by: str
    reason: str


class UncordonNode(_NodeMessage, tag="UncordonNode", frozen=True):
    node_id: str
    cluster: str
    by: str
    reason: str


NodeEvent = (
    NodeRegistered
    | NodeHeartbeat
    | NodeLost
    | GpuTelemetry
    | XidObserved
    | NodeStateChanged
    | CordonNode
    | DrainNode
    | UncordonNode
)
