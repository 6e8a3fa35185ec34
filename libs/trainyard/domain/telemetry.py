"""GPU telemetry as read by the node agent: plain values, no NVML here.

``None`` in a field means the driver did not report it; nothing is invented.
"""

from __future__ import annotations

import msgspec

#: Clock event (throttle) reason bits, as defined by NVML (nvmlClocksEventReason*).
CLOCK_EVENT_REASONS: dict[int, str] = {
    0x001: "gpu_idle",
    0x002: "applications_clocks_setting",
    0x004: "sw_power_cap",
    0x008: "hw_slowdown",
    0x010: "sync_boost",
    0x020: "sw_thermal_slowdown",
    0x040: "hw_thermal_slowdown",
    0x080: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}

#: NVML_GPU_RECOVERY_ACTION_* values of the NVML_FI_DEV_GET_GPU_RECOVERY_ACTION field.
RECOVERY_ACTIONS: dict[int, str] = {
    0: "none",
    1: "gpu_reset",
    2: "node_reboot",
    3: "drain_p2p",
    4: "drain_and_reset",
    5: "recover_imex_domain",
    6: "bus_reset",
    7: "system_reboot",
}


def decode_clock_event_reasons(mask: int) -> list[str]:
    """Names of the bits set in an NVML clock event reason mask, lowest bit first."""
    names = [name for bit, name in sorted(CLOCK_EVENT_REASONS.items()) if mask & bit]
    unknown = mask & ~sum(CLOCK_EVENT_REASONS)
    bit = 1
    while unknown:
        if unknown & bit:
            names.append(f"unknown_0x{bit:x}")
            unknown &= ~bit
        bit <<= 1
    return names


class NvLinkErrorCounts(msgspec.Struct, frozen=True):
    """NVLink data-link error counters, summed over every link of one GPU."""

    replay: int | None = None
    recovery: int | None = None
    crc: int | None = None  # CRC flit + CRC data errors

    @property
    def total(self) -> int:
        return (self.replay or 0) + (self.recovery or 0) + (self.crc or 0)


class GpuSample(msgspec.Struct, frozen=True, kw_only=True):
    """One reading of one GPU.  ``None`` means the driver did not report it."""

    index: int
    uuid: str | None = None
    name: str | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    ecc_corrected_volatile: int | None = None  # since the last driver load / reset
    ecc_uncorrected_volatile: int | None = None
    ecc_corrected_aggregate: int | None = None  # lifetime, kept in the InfoROM
    ecc_uncorrected_aggregate: int | None = None
    retired_pages_sbe: int | None = None  # pre-Ampere page retirement
    retired_pages_dbe: int | None = None
    row_remap_pending: bool | None = None  # Ampere and later: reset needed to remap
    row_remap_failed: bool | None = None  # remapping ran out of spare rows
    clock_event_reasons: int | None = None  # NVML bitmask
    clock_event_reason_names: list[str] = []  # decoded from the bitmask
    nvlink_links_up: list[int] | None = None  # link numbers
    nvlink_links_down: list[int] | None = None
    nvlink_error_counts: NvLinkErrorCounts | None = None
    pcie_replay_counter: int | None = None
    recovery_action: str | None = None  # a RECOVERY_ACTIONS name
    gpu_lost: bool = False  # NVML answered "GPU is lost" (fallen off the bus)
    reset_required: bool = False  # NVML answered "GPU requires reset"
    read_errors: dict[str, str] = {}  # call name -> error, for calls that failed otherwise


class XidEvent(msgspec.Struct, frozen=True):
    """A critical XID reported by the driver for one GPU."""

    gpu_index: int
    uuid: str | None
    xid: int
    at: float


class NodeSample(msgspec.Struct, frozen=True):
    """Every GPU of one node, read at one time."""

    node_id: str
    at: float
    gpus: list[GpuSample]
