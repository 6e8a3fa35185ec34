"""The emulator's control endpoint: fault injection and agent operations for
every emulated node of a cluster, over NATS core request/reply.

``trainyard emulate inject --node n12 --xid 79`` sends a ``ControlRequest`` to
``trainyard.emulator.<cluster>.control``; health's checks and GPU resets come
to ``trainyard.agent.<cluster>.<node>.control``, which the emulator answers for
its nodes.  A fault is published the way a real agent would report it: an XID
at once (with an acknowledgement), a changed reading as a telemetry sample
straight away.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from nats.aio.msg import Msg

from trainyard.agent import control
from trainyard.agent.node import NodeAgent
from trainyard.emulator.faults import FaultRefused, apply_fault
from trainyard.gpu.fake import FakeGpuBackend

log = logging.getLogger(__name__)


class EmulatorControl:
    def __init__(
        self,
        agents: Mapping[str, NodeAgent],
        backends: Mapping[str, FakeGpuBackend],
        silent: set[str],
        clock: Callable[[], float],
    ) -> None:
        self.agents = agents
        self.backends = backends
        self.silent = silent
        self.clock = clock

    async def handle(self, request: control.ControlRequest) -> control.ControlReply:
        agent = self.agents.get(request.node_id)
        backend = self.backends.get(request.node_id)
        if agent is None or backend is None:
            known = ", ".join(sorted(self.agents)[:5]) + (", ..." if len(self.agents) > 5 else "")
            return control.ControlReply(ok=False, message=f"no emulated node {request.node_id!r} here (nodes: {known})")
        if request.op in control.AGENT_OPS:
            return agent.answer(request)
        at = self.clock()
        try:
            message = apply_fault(backend, request, self.silent)
        except (FaultRefused, IndexError, ValueError) as err:
            return control.ControlReply(ok=False, message=f"fault not injected: {err}")
        agent.silent = request.node_id in self.silent
        if request.op == "xid":
            await agent.publish_xids(backend.wait_xid(0))
        elif request.op != "silent":
            await agent.publish_sample()
        log.warning("fault injected%s: %s", f" by {request.by}" if request.by else "", message)
        return control.ControlReply(ok=True, message=message, details={"injected_at": repr(at)})

    async def on_message(self, msg: Msg) -> None:
        request = control.decode_request(msg.data)
        if isinstance(request, control.ControlRequest):
            # A request on one node's agent subject is about that node.
            parts = msg.subject.split(".")
            if parts[1] == "agent" and len(parts) == 5 and parts[3] != request.node_id:
                reply = control.ControlReply(ok=False, message=f"request for {request.node_id} sent to {parts[3]}")
            else:
                try:
                    reply = await self.handle(request)
                except Exception as err:  # noqa: BLE001 - answered, never raised into NATS
                    reply = control.ControlReply(ok=False, message=f"{request.op} failed: {err!r}")
        else:
            reply = request
        await msg.respond(control.encode(reply))
