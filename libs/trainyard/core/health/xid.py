"""The XID catalog: what each critical XID means for a node, as data.

Source: NVIDIA, "XID Errors" and "Analyzing Xid Errors with the Xid Catalog"
(https://docs.nvidia.com/deploy/xid-errors/), whose per-XID "Resolution Bucket
(Immediate Action)" (RESTART_APP, RESET_GPU, RESTART_BM, CONTACT_SUPPORT, ...)
is mapped here onto Trainyard's remedies, and NVIDIA's "GPU Memory Error
Management" guide for the ECC / row-remapping XIDs (63, 64, 92, 94, 95).
Severities are an operations judgement for training fleets: an XID that only
kills the offending application leaves the node in service; one that leaves
the GPU in a bad state isolates the node.  Review the table against the
catalog of the driver branch in use when it changes, and bump the version.
"""

from __future__ import annotations

import msgspec

from trainyard.core.health.findings import Remedy, Severity

#: Bump whenever an entry changes; recorded on every finding made from the table.
XID_CATALOG_VERSION = "xid-catalog-2026.11-1"


class XidRule(msgspec.Struct, frozen=True):
    xid: int
    severity: Severity
    action: Remedy
    description: str


_I, _S, _F = Severity.INFO, Severity.SUSPECT, Severity.FATAL
_IGNORE, _RESTART, _RESET, _REBOOT, _DRAIN = (
    Remedy.IGNORE,
    Remedy.RESTART_JOB,
    Remedy.RESET_GPU,
    Remedy.REBOOT_NODE,
    Remedy.DRAIN_NOW,
)

_TABLE: tuple[XidRule, ...] = (
    # Application-level faults: the driver kills the offending context; the GPU is fine.
    XidRule(8, _I, _RESTART, "GPU stopped processing (channel idle timeout); restart the job"),
    XidRule(11, _I, _RESTART, "invalid or corrupted push buffer stream; usually the application"),
    XidRule(13, _I, _RESTART, "graphics engine exception; usually an application bug (illegal address)"),
    XidRule(31, _I, _RESTART, "GPU memory page fault (MMU); usually an application bug"),
    XidRule(43, _I, _IGNORE, "GPU stopped processing the channel; the application was stopped, GPU unaffected"),
    XidRule(45, _I, _IGNORE, "preemptive cleanup after an earlier error; follows another XID"),
    XidRule(68, _I, _RESTART, "video decoder exception"),
    XidRule(69, _I, _RESTART, "graphics engine class error"),
    XidRule(109, _I, _RESTART, "context switch timeout"),
    # Memory errors.
    XidRule(48, _F, _RESET, "double-bit ECC error; reset the GPU, drain if it recurs"),
    XidRule(63, _S, _RESET, "row remapping / page retirement recorded; reset the GPU to activate the remap"),
    XidRule(64, _F, _DRAIN, "row remapping / page retirement failed to record; replace the GPU"),
    XidRule(92, _S, _RESET, "high single-bit ECC error rate"),
    XidRule(94, _I, _RESTART, "contained uncorrectable ECC error; only the affected job was killed"),
    XidRule(95, _F, _RESET, "uncontained uncorrectable ECC error; every job on the GPU is affected"),
    XidRule(140, _F, _RESET, "unrecovered ECC error; the GPU needs a reset"),
    # Firmware, interconnect and bus.
    XidRule(32, _S, _RESET, "invalid or corrupted push buffer stream (DMA / PCIe fault)"),
    XidRule(38, _S, _RESET, "driver firmware error"),
    XidRule(61, _S, _RESET, "internal micro-controller breakpoint / warning"),
    XidRule(62, _F, _RESET, "internal micro-controller halt"),
    XidRule(74, _F, _RESET, "NVLink error; reset the GPU, check cabling / NVSwitch if it recurs"),
    XidRule(79, _F, _DRAIN, "GPU has fallen off the bus"),
    XidRule(119, _F, _RESET, "GSP RPC timeout; reset the GPU, reboot if the reset fails"),
    XidRule(120, _F, _REBOOT, "GSP error; reset the GPU or reboot the node"),
    XidRule(121, _F, _RESET, "C2C link error (Grace Hopper)"),
    XidRule(143, _F, _REBOOT, "GPU initialisation failure"),
    XidRule(154, _I, _IGNORE, "GPU recovery action changed; the action itself is read from NVML"),
)

XID_CATALOG: dict[int, XidRule] = {rule.xid: rule for rule in _TABLE}


def classify_xid(xid: int) -> XidRule:
    """The catalog entry for an XID; an XID not in the catalog is suspect until checks pass."""
    rule = XID_CATALOG.get(xid)
    if rule is not None:
        return rule
    return XidRule(xid, _S, _RESET, f"XID {xid} is not in {XID_CATALOG_VERSION}; treated as suspect")
