"""GPU readings for the node agent: sample types, the NVML backend and a fake one."""

from trainyard.gpu.fake import FakeGpuBackend
from trainyard.gpu.nvml import (
    CLOCK_EVENT_REASONS,
    RECOVERY_ACTIONS,
    GpuBackend,
    GpuSample,
    NodeSample,
    NvLinkErrorCounts,
    NvmlBackend,
    NvmlUnavailable,
    XidEvent,
    decode_clock_event_reasons,
    sample_node,
)

__all__ = [
    "CLOCK_EVENT_REASONS",
    "RECOVERY_ACTIONS",
    "FakeGpuBackend",
    "GpuBackend",
    "GpuSample",
    "NodeSample",
    "NvLinkErrorCounts",
    "NvmlBackend",
    "NvmlUnavailable",
    "XidEvent",
    "decode_clock_event_reasons",
    "sample_node",
]
