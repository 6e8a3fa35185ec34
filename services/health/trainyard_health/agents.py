"""Requests to node agents (checks, GPU resets), answered by the agent or the emulator."""

from __future__ import annotations

import logging

import nats.errors

from trainyard.agent import control
from trainyard.bus import Bus
from trainyard.domain.node import NodeInfo

log = logging.getLogger(__name__)


async def ask_agent(
    bus: Bus, info: NodeInfo, request: control.ControlRequest, timeout_s: float = 2.0
) -> control.ControlReply | None:
    """The agent's answer, or None when no agent answered in time."""
    subject = control.agent_control_subject(info.cluster, info.node_id)
    try:
        msg = await bus.nc.request(subject, control.encode(request), timeout=timeout_s)
    except (TimeoutError, nats.errors.TimeoutError, nats.errors.NoRespondersError):
        return None
    return control.decode_reply(msg.data)


async def reset_gpu(bus: Bus, info: NodeInfo, gpu: int | None) -> None:
    gpus = range(info.gpus) if gpu is None else [gpu]
    for g in gpus:
        request = control.ControlRequest(op="reset_gpu", node_id=info.node_id, gpu=g, by="service:health")
        reply = await ask_agent(bus, info, request)
        if reply is None or not reply.ok:
            log.warning("reset of %s GPU %d: %s", info.node_id, g, "no answer" if reply is None else reply.message)
