"""What the health rules conclude about a node: findings, their severity and the remedy."""

from __future__ import annotations

import enum

import msgspec


class Severity(str, enum.Enum):
    INFO = "info"  # worth recording; the node stays in service
    SUSPECT = "suspect"  # take no new work until checks pass
    FATAL = "fatal"  # isolate the node now and recover its runs


class Remedy(str, enum.Enum):
    """What fixes the fault, mildest first (NVIDIA's "immediate action" buckets)."""

    IGNORE = "ignore"
    RESTART_JOB = "restart_job"
    RESET_GPU = "reset_gpu"
    REBOOT_NODE = "reboot_node"
    DRAIN_NOW = "drain_now"  # hardware is gone or must be replaced: drain, then repair by hand


#: Order of remedies, mildest first; when several apply, the strongest wins.
REMEDY_ORDER = (Remedy.IGNORE, Remedy.RESTART_JOB, Remedy.RESET_GPU, Remedy.REBOOT_NODE, Remedy.DRAIN_NOW)
SEVERITY_ORDER = (Severity.INFO, Severity.SUSPECT, Severity.FATAL)


def strongest_remedy(*remedies: Remedy | None) -> Remedy | None:
    present = [r for r in remedies if r is not None]
    return max(present, key=REMEDY_ORDER.index) if present else None


class FindingKind(str, enum.Enum):
    XID = "xid"
    ECC_CORRECTED_RATE = "ecc_corrected_rate"
    ECC_UNCORRECTED = "ecc_uncorrected"
    RETIRED_PAGES = "retired_pages"
    ROW_REMAP_PENDING = "row_remap_pending"
    ROW_REMAP_FAILED = "row_remap_failed"
    TEMPERATURE = "temperature"
    THROTTLE = "throttle"
    NVLINK_DOWN = "nvlink_down"
    NVLINK_ERRORS = "nvlink_errors"
    PCIE_REPLAY = "pcie_replay"
    RECOVERY_ACTION = "recovery_action"
    RESET_REQUIRED = "reset_required"
    GPU_LOST = "gpu_lost"
    GPU_MISSING = "gpu_missing"
    HEARTBEAT_TIMEOUT = "heartbeat_timeout"


class Finding(msgspec.Struct, frozen=True, kw_only=True):
    """One conclusion about one node (and GPU, where it is about one)."""

    node_id: str
    gpu: int | None  # None: about the whole node
    kind: FindingKind
    severity: Severity
    action: Remedy
    message: str  # for people: what was seen and what it means
    at: float  # when the observation was made
    rules_version: str = ""
