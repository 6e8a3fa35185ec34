"""Node lifecycle messages, subject trainyard.nodes.<cluster>.<node_id>;
heartbeats go to trainyard.telemetry.<cluster>.<node_id>."""

from __future__ import annotations

import msgspec

from trainyard.domain.node import NodeInfo


class _NodeMessage(msgspec.Struct, tag_field="type", kw_only=True, frozen=True):
    at: float


class NodeRegistered(_NodeMessage, tag="NodeRegistered"):
    node: NodeInfo
    boot_id: str  # changes when the agent restarts; fences heartbeats of older boots


class NodeHeartbeat(_NodeMessage, tag="NodeHeartbeat"):
    node_id: str
    cluster: str
    boot_id: str
    running_runs: list[str] = []


class NodeLost(_NodeMessage, tag="NodeLost"):
    node_id: str
    cluster: str
    boot_id: str  # the boot that went silent; a newer boot is not lost
    last_heartbeat_at: float
    reason: str = "no heartbeat"


NodeEvent = NodeRegistered | NodeHeartbeat | NodeLost
