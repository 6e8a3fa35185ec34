"""The node agent: reads a node's GPUs (NVML on a real node, the fake in the
emulator and tests) and reports heartbeats, periodic telemetry and XIDs; runs
pre-run / post-run checks and answers control requests from health and operators."""

from trainyard.agent.checks import CheckReport, run_checks
from trainyard.agent.control import ControlReply, ControlRequest, agent_control_subject, emulator_control_subject
from trainyard.agent.node import NodeAgent

__all__ = [
    "CheckReport",
    "ControlReply",
    "ControlRequest",
    "NodeAgent",
    "agent_control_subject",
    "emulator_control_subject",
    "run_checks",
]
