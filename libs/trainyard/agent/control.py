"""Control requests to agents and the emulator, over NATS core request/reply.

Subjects:

- ``trainyard.agent.<cluster>.<node_id>.control`` — one node's agent: ``check``
  (run the health checks now), ``reset_gpu``, ``probe`` (NVML report), and on
  an agent that executes runs, ``logs`` (below).
- ``trainyard.emulator.<cluster>.control`` — the emulator of a cluster: the
  same operations for any of its nodes, plus fault injection (``xid``,
  ``ecc``, ``overheat``, ``nvlink_down``, ``gpu_lost``, ``silent``, ``clear``).

Every request gets one ``ControlReply`` saying whether it was done and what
happened; a bad request is answered ``ok=False`` with the reason.

``logs`` reads one rank's current log file of one attempt of a job on that node.
An agent that executes runs answers it on its control subject and on
``trainyard.agent.<cluster>.<node_id>.logs`` (:func:`agent_logs_subject`), which
answers ``logs`` only, so the gateway can be allowed that and nothing else:

    request  {"op": "logs", "node_id": "n1", "job_id": "j-1", "attempt": 1, "rank": 0,
              "offset": 0, "limit": 65536}
    reply    {"ok": true, "message": "...", "data": "<base64 of the bytes>",
              "details": {"offset": "0", "next_offset": "1234", "size": "1234"}}

``offset`` counts bytes from the start of the current file; a negative offset
counts back from its end (``-4096``: the last 4 KiB).  At most ``limit`` bytes
(capped at 256 KiB) come back; read on from ``next_offset`` to follow the
file.  ``size`` is the file's size now; after a rotation (the file was copied
to ``.1`` and emptied) it is smaller than an offset read before, and a reader
starts again from 0.  A job, attempt or rank without a log on that node is
answered ``ok=False`` saying so.
"""

from __future__ import annotations

import msgspec

from trainyard.events.subjects import PREFIX, token

_encoder = msgspec.json.Encoder()
_requests = msgspec.json.Decoder(None)

#: Operations an agent answers; the emulator answers these and the faults below.
AGENT_OPS = ("check", "reset_gpu", "probe", "logs")
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
    job_id: str = ""  # op "logs": the job, its attempt and rank
    attempt: int = 0
    rank: int = 0
    offset: int = 0  # op "logs": where to read from (negative: from the end)
    limit: int = 64 * 1024  # op "logs": at most this many bytes


class ControlReply(msgspec.Struct, frozen=True, kw_only=True):
    ok: bool
    message: str
    details: dict[str, str] = {}
    data: bytes = b""  # op "logs": the bytes read (base64 in JSON)


def agent_control_subject(cluster: str, node_id: str) -> str:
    return f"{PREFIX}.agent.{token(cluster)}.{token(node_id)}.control"


def agent_logs_subject(cluster: str, node_id: str) -> str:
    """Where one node's agent answers ``logs`` requests, and nothing else: the
    gateway may ask here for a job's output without being able to reset GPUs."""
    return f"{PREFIX}.agent.{token(cluster)}.{token(node_id)}.logs"


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
