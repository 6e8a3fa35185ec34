"""Fault injection on emulated nodes: one control request -> one change to a
node's fake GPUs (or its heartbeats), and a sentence saying what was done."""

from __future__ import annotations

from trainyard.agent.control import ControlRequest
from trainyard.gpu.fake import FakeGpuBackend

DEFAULT_ECC_BURST = 5000  # corrected errors: far over the default 1000/h rate
DEFAULT_OVERHEAT_C = 95.0


class FaultRefused(ValueError):
    """The request cannot be applied (bad GPU index, missing argument)."""


def apply_fault(backend: FakeGpuBackend, request: ControlRequest, silent: set[str]) -> str:
    """Apply ``request`` to one node's backend; ``silent`` holds the nodes that stopped heartbeating."""
    op, node, gpu = request.op, request.node_id, request.gpu
    if op != "silent" and op != "clear" and not 0 <= gpu < backend.device_count():
        raise FaultRefused(f"{node} has GPUs 0..{backend.device_count() - 1}, not {gpu}")
    if op == "xid":
        if request.xid is None or request.xid <= 0:
            raise FaultRefused("op xid needs a positive --xid")
        backend.inject_xid(gpu, request.xid)
        return f"XID {request.xid} injected on {node} GPU {gpu}"
    if op == "ecc":
        corrected = DEFAULT_ECC_BURST if request.count is None else request.count
        if corrected < 0 or request.uncorrected < 0:
            raise FaultRefused("error counts must not be negative")
        backend.inject_ecc_burst(gpu, corrected, request.uncorrected)
        return f"ECC burst on {node} GPU {gpu}: {corrected} corrected, {request.uncorrected} uncorrected"
    if op == "overheat":
        c = DEFAULT_OVERHEAT_C if request.temperature_c is None else request.temperature_c
        backend.set_temperature(gpu, c)
        return f"{node} GPU {gpu} now at {c:.0f} C"
    if op == "nvlink_down":
        links = request.links if request.links else [0]
        try:
            backend.set_nvlink_down(gpu, links)
        except ValueError as err:
            raise FaultRefused(str(err)) from err
        return f"NVLink link(s) {sorted(links)} of {node} GPU {gpu} down"
    if op == "gpu_lost":
        backend.lose_gpu(gpu)
        return f"{node} GPU {gpu} fell off the bus"
    if op == "silent":
        silent.add(node)
        return f"{node} stopped heartbeating and reporting"
    if op == "clear":
        backend.clear()
        silent.discard(node)
        return f"{node} GPUs back to healthy; heartbeats resumed"
    raise FaultRefused(f"{op!r} is not a fault")
