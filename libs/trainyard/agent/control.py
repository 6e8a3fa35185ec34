"""Control requests to agents and the emulator, over NATS core request/reply.

Subjects:

- ``trainyard.agent.<cluster>.<node_id>.control`` — one node's agent: ``check``
  (run the health checks now), ``reset_gpu``, ``probe`` (NVML report).
- ``trainyard.emulator.<cluster>.control`` — the emulator of a cluster: the
  same operations for any of its nodes, plus fault injection (``xid``,
  ``ecc``, ``overheat``, ``nvlink_down``, ``gpu_lost``, ``silent``, ``clear``).

Every request gets one ``ControlReply`` saying whether it was done and what
happened; a bad request is answered ``ok=False`` with the reason.
"""

from __future__ import annotations

import msgspec

from trainyard.events.subjects import PREFIX, token

_encoder = msgspec.json.Encoder()
_requests = msgspec.json.Decoder(None)

#: Operations an agent answers; the emulator answers these and the faults below.
AGENT_OPS = ("check", "reset_gpu", "probe")
FAULT_OPS = ("xid", "ecc", "overheat", "nvlink_down", "gpu_lost", "silent", "clear")


class ControlRequest(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    op: str  # one of AGENT_OPS or FAULT_OPS
    node_id: str
    gpu: int = 0
    xid: int | None = None  # op "xid"
    count: int | None = None  # op "ecc": corrected errors in the burst
    uncorrected: int = 0  # op "ecc"
    temperature_c: float | None = None  # op "overheat"
    links: list[int] | None = None  # op "nvlink_down"
    by: str = ""  # who asked, for the emulator's log


class ControlReply(msgspec.Struct, frozen=True, kw_only=True):
    ok: bool
    message: str
    details: dict[str, str] = {}


def agent_control_subject(cluster: str, node_id: str) -> str:
    return f"{PREFIX}.agent.{token(cluster)}.{token(node_id)}.control"


def agent_control_wildcard(cluster: str) -> str:
    return f"{PREFIX}.agent.{token(cluster)}.*.control"


def emulator_control_subject(cluster: str) -> str:
    return f"{PREFIX}.emulator.{token(cluster)}.control"


def encode(message: ControlRequest | ControlReply) -> bytes:
    return _encoder.encode(message)


def decode_request(data: bytes) -> ControlRequest | ControlReply:
    """The request, or a refusal saying what is wrong with it."""
    try:
        request = msgspec.json.decode(data, type=ControlRequest)
    except (msgspec.DecodeError, msgspec.ValidationError) as err:
        return ControlReply(ok=False, message=f"bad control request: {err}")
    if request.op not in AGENT_OPS + FAULT_OPS:
        return ControlReply(ok=False, message=f"unknown op {request.op!r}; one of {', '.join(AGENT_OPS + FAULT_OPS)}")
    return request


def decode_reply(data: bytes) -> ControlReply:
    return msgspec.json.decode(data, type=ControlReply)
