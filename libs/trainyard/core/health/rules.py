"""Health rules: telemetry, XIDs and heartbeats -> findings about a node.

Pure: the caller passes the record, the observation, the previous sample (for
rates: thresholds compare deltas between consecutive samples) and the time.
Conditions (a hot GPU, a pending row remap, a link down) are reported on every
sample that shows them; counters (ECC, NVLink, PCIe) are reported when their
rate between two samples crosses a threshold.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import msgspec

from trainyard.core.health.findings import Finding, FindingKind, Remedy, Severity
from trainyard.core.health.xid import XID_CATALOG_VERSION, classify_xid
from trainyard.domain.node import NodeState
from trainyard.domain.telemetry import GpuSample, NodeSample, XidEvent

#: Records one finding: (GPU index or None for the node, kind, severity, remedy, message).
AddFinding = Callable[[int | None, FindingKind, Severity, Remedy, str], None]

if TYPE_CHECKING:
    from trainyard.core.health.state import NodeHealthRecord

RULES_VERSION = "health-rules-2026.11-1"


class HealthPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """Thresholds of the health rules; versioned so that every finding says which rules made it."""

    rules_version: str = RULES_VERSION
    # GPU telemetry
    ecc_corrected_per_hour: float = 1000.0  # corrected (single-bit) ECC errors per hour -> suspect
    min_rate_interval_s: float = 10.0  # shorter sample intervals count as this long, so one error is never a burst
    temperature_limit_c: float = 87.0  # GPU core temperature -> suspect
    throttle_reasons: frozenset[str] = frozenset(
        {"hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown"}
    )  # clock event reasons that count when they hold across two consecutive samples
    nvlink_errors_per_interval: int = 100  # replay + recovery + CRC errors between two samples
    pcie_replays_per_interval: int = 100
    retired_pages_limit: int = 60  # retired pages (pre-Ampere) at which a GPU is replaced
    # node liveness
    heartbeat_timeout_s: float = 60.0
    # state machine
    suspect_causes_to_cordon: int = 3  # distinct suspect causes in one suspect episode -> cordon
    flap_limit: int = 3  # entries into suspect within flap_window_s -> cordon instead
    flap_window_s: float = 3600.0
    lemon_incidents: int = 3  # fatal incidents within lemon_window_s keep a node in repair
    lemon_window_s: float = 7 * 24 * 3600.0
    history_limit: int = 50  # history entries kept on a node's record
    # fleet
    rack_fault_min_nodes: int = 3  # distinct failing nodes of one rack within the window -> rack fault
    rack_fault_window_s: float = 300.0
    blast_radius_max_share: float = 0.1  # most of a pool automation may take out of service
    blast_radius_min_nodes: int = 1  # ... but always at least this many nodes
    pool_label: str = "trainyard.io/pool"  # node label naming its pool; else cluster/gpu_type

    def __post_init__(self) -> None:
        problems = [
            name
            for name, ok in [
                ("ecc_corrected_per_hour must be > 0", self.ecc_corrected_per_hour > 0),
                ("min_rate_interval_s must be > 0", self.min_rate_interval_s > 0),
                ("heartbeat_timeout_s must be > 0", self.heartbeat_timeout_s > 0),
                ("suspect_causes_to_cordon must be >= 1", self.suspect_causes_to_cordon >= 1),
                ("flap_limit must be >= 2", self.flap_limit >= 2),
                ("lemon_incidents must be >= 1", self.lemon_incidents >= 1),
                ("history_limit must be >= 1", self.history_limit >= 1),
                ("rack_fault_min_nodes must be >= 2", self.rack_fault_min_nodes >= 2),
                ("blast_radius_max_share must be in [0, 1]", 0.0 <= self.blast_radius_max_share <= 1.0),
                ("blast_radius_min_nodes must be >= 0", self.blast_radius_min_nodes >= 0),
            ]
            if not ok
        ]
        if problems:
            raise ValueError("invalid health policy: " + "; ".join(problems))


DEFAULT_POLICY = HealthPolicy()


class HeartbeatGap(msgspec.Struct, frozen=True):
    """The last heartbeat seen from a node; evaluated against ``now``."""

    last_seen_at: float


Observation = NodeSample | Sequence[XidEvent] | HeartbeatGap


def evaluate(
    record: NodeHealthRecord,
    observation: Observation,
    policy: HealthPolicy,
    now: float,
    previous: NodeSample | None = None,
) -> list[Finding]:
    """Findings about ``record``'s node from one observation."""
    if isinstance(observation, NodeSample):
        return evaluate_sample(record, observation, previous, policy)
    if isinstance(observation, HeartbeatGap):
        return evaluate_heartbeat(record, observation.last_seen_at, policy, now)
    return evaluate_xids(record, observation, policy)


def evaluate_heartbeat(
    record: NodeHealthRecord, last_seen_at: float, policy: HealthPolicy, now: float
) -> list[Finding]:
    gap = now - last_seen_at
    if record.state == NodeState.LOST or gap <= policy.heartbeat_timeout_s:
        return []
    return [
        Finding(
            node_id=record.node_id,
            gpu=None,
            kind=FindingKind.HEARTBEAT_TIMEOUT,
            severity=Severity.FATAL,
            action=Remedy.REBOOT_NODE,
            message=f"no heartbeat for {gap:.0f} s (limit {policy.heartbeat_timeout_s:.0f} s)",
            at=now,
            rules_version=policy.rules_version,
        )
    ]


def evaluate_xids(record: NodeHealthRecord, events: Sequence[XidEvent], policy: HealthPolicy) -> list[Finding]:
    findings = []
    for event in events:
        rule = classify_xid(event.xid)
        findings.append(
            Finding(
                node_id=record.node_id,
                gpu=event.gpu_index if event.gpu_index >= 0 else None,
                kind=FindingKind.XID,
                severity=rule.severity,
                action=rule.action,
                message=f"XID {event.xid} on GPU {event.gpu_index}: {rule.description}",
                at=event.at,
                rules_version=f"{policy.rules_version}+{XID_CATALOG_VERSION}",
            )
        )
    return findings


def evaluate_sample(
    record: NodeHealthRecord, sample: NodeSample, previous: NodeSample | None, policy: HealthPolicy
) -> list[Finding]:
    if sample.node_id != record.node_id:
        raise ValueError(f"sample of node {sample.node_id!r} evaluated against record of {record.node_id!r}")
    findings: list[Finding] = []

    def add(gpu: int | None, kind: FindingKind, severity: Severity, action: Remedy, message: str) -> None:
        findings.append(
            Finding(
                node_id=record.node_id,
                gpu=gpu,
                kind=kind,
                severity=severity,
                action=action,
                message=message if gpu is None else f"GPU {gpu}: {message}",
                at=sample.at,
                rules_version=policy.rules_version,
            )
        )

    if record.expected_gpus is not None and len(sample.gpus) < record.expected_gpus:
        add(
            None,
            FindingKind.GPU_MISSING,
            Severity.FATAL,
            Remedy.DRAIN_NOW,
            f"{len(sample.gpus)} of {record.expected_gpus} GPUs visible",
        )
    usable_previous = previous is not None and previous.at < sample.at
    before = {g.index: g for g in previous.gpus} if usable_previous and previous is not None else {}
    interval = sample.at - previous.at if usable_previous and previous is not None else None
    for gpu in sample.gpus:
        _gpu_rules(gpu, before.get(gpu.index), interval, policy, add)
    return findings


def _gpu_rules(
    gpu: GpuSample, prev: GpuSample | None, interval: float | None, policy: HealthPolicy, add: AddFinding
) -> None:
    i = gpu.index
    # 1. The GPU is gone or must be reset: nothing else it reports matters.
    if gpu.gpu_lost:
        add(i, FindingKind.GPU_LOST, Severity.FATAL, Remedy.DRAIN_NOW, "GPU is lost (fallen off the bus)")
        return
    if gpu.reset_required:
        add(i, FindingKind.RESET_REQUIRED, Severity.FATAL, Remedy.RESET_GPU, "driver reports the GPU requires a reset")
    # 2. The driver's own recovery verdict.
    _recovery_action_rule(i, gpu.recovery_action, add)
    # 3. Memory.
    if gpu.row_remap_failed:
        add(i, FindingKind.ROW_REMAP_FAILED, Severity.FATAL, Remedy.DRAIN_NOW, "row remapping failed; replace the GPU")
    elif gpu.row_remap_pending:
        add(
            i,
            FindingKind.ROW_REMAP_PENDING,
            Severity.SUSPECT,
            Remedy.RESET_GPU,
            "row remap pending; reset to activate it",
        )
    retired = (gpu.retired_pages_sbe or 0) + (gpu.retired_pages_dbe or 0)
    if retired >= policy.retired_pages_limit:
        add(
            i,
            FindingKind.RETIRED_PAGES,
            Severity.FATAL,
            Remedy.DRAIN_NOW,
            f"{retired} retired pages (limit {policy.retired_pages_limit}); replace the GPU",
        )
    elif (dbe := _delta(gpu.retired_pages_dbe, prev.retired_pages_dbe if prev is not None else None)) and dbe > 0:
        add(
            i,
            FindingKind.RETIRED_PAGES,
            Severity.SUSPECT,
            Remedy.RESET_GPU,
            f"{dbe} new page(s) retired for double-bit errors",
        )
    uncorrected = _delta(gpu.ecc_uncorrected_volatile, prev.ecc_uncorrected_volatile if prev is not None else None)
    if uncorrected is not None and uncorrected > 0:
        add(
            i,
            FindingKind.ECC_UNCORRECTED,
            Severity.SUSPECT,
            Remedy.RESET_GPU,
            f"{uncorrected} new uncorrectable ECC error(s)",
        )
    corrected = _delta(gpu.ecc_corrected_volatile, prev.ecc_corrected_volatile if prev is not None else None)
    if corrected is None:  # some boards only keep lifetime counters
        corrected = _delta(gpu.ecc_corrected_aggregate, prev.ecc_corrected_aggregate if prev is not None else None)
    if corrected and interval is not None:
        per_hour = corrected * 3600.0 / max(interval, policy.min_rate_interval_s)
        if per_hour >= policy.ecc_corrected_per_hour:
            add(
                i,
                FindingKind.ECC_CORRECTED_RATE,
                Severity.SUSPECT,
                Remedy.RESET_GPU,
                f"{corrected} corrected ECC errors in {interval:.0f} s ({per_hour:.0f}/h, limit {policy.ecc_corrected_per_hour:.0f}/h)",
            )
    # 4. Heat and clocks.
    if gpu.temperature_c is not None and gpu.temperature_c >= policy.temperature_limit_c:
        add(
            i,
            FindingKind.TEMPERATURE,
            Severity.SUSPECT,
            Remedy.IGNORE,
            f"temperature {gpu.temperature_c:.0f} C (limit {policy.temperature_limit_c:.0f} C); check cooling",
        )
    if prev is not None:
        held = set(gpu.clock_event_reason_names) & set(prev.clock_event_reason_names) & policy.throttle_reasons
        if held:
            add(
                i,
                FindingKind.THROTTLE,
                Severity.SUSPECT,
                Remedy.IGNORE,
                f"clocks held down by {', '.join(sorted(held))} across two samples",
            )
    # 5. Interconnect.
    if gpu.nvlink_links_down:
        was_up = set(prev.nvlink_links_up or []) if prev is not None else set()
        newly_down = sorted(set(gpu.nvlink_links_down) & was_up)
        if newly_down:
            add(i, FindingKind.NVLINK_DOWN, Severity.FATAL, Remedy.RESET_GPU, f"NVLink link(s) {newly_down} went down")
        else:
            add(
                i,
                FindingKind.NVLINK_DOWN,
                Severity.SUSPECT,
                Remedy.RESET_GPU,
                f"NVLink link(s) {sorted(gpu.nvlink_links_down)} down",
            )
    if gpu.nvlink_error_counts is not None and prev is not None and prev.nvlink_error_counts is not None:
        link_errors = _delta(gpu.nvlink_error_counts.total, prev.nvlink_error_counts.total)
        if link_errors is not None and link_errors >= policy.nvlink_errors_per_interval:
            add(
                i,
                FindingKind.NVLINK_ERRORS,
                Severity.SUSPECT,
                Remedy.RESET_GPU,
                f"{link_errors} NVLink replay/recovery/CRC errors since the last sample",
            )
    replays = _delta(gpu.pcie_replay_counter, prev.pcie_replay_counter if prev is not None else None)
    if replays is not None and replays >= policy.pcie_replays_per_interval:
        add(
            i,
            FindingKind.PCIE_REPLAY,
            Severity.SUSPECT,
            Remedy.IGNORE,
            f"{replays} PCIe replays since the last sample; check the slot / riser",
        )


_RECOVERY_ACTION_RULES: dict[str, tuple[Severity, Remedy]] = {
    "gpu_reset": (Severity.FATAL, Remedy.RESET_GPU),
    "bus_reset": (Severity.FATAL, Remedy.RESET_GPU),
    "drain_and_reset": (Severity.FATAL, Remedy.RESET_GPU),
    "node_reboot": (Severity.FATAL, Remedy.REBOOT_NODE),
    "system_reboot": (Severity.FATAL, Remedy.REBOOT_NODE),
    "drain_p2p": (Severity.SUSPECT, Remedy.RESET_GPU),
    "recover_imex_domain": (Severity.SUSPECT, Remedy.RESET_GPU),
}


def _recovery_action_rule(i: int, action: str | None, add: AddFinding) -> None:
    if action is None or action == "none":
        return
    severity, remedy = _RECOVERY_ACTION_RULES.get(action, (Severity.SUSPECT, Remedy.RESET_GPU))
    add(i, FindingKind.RECOVERY_ACTION, severity, remedy, f"driver asks for recovery action {action!r}")


def _delta(current: int | None, previous: int | None) -> int | None:
    """Growth of a counter; None when either side is unknown or the counter was reset."""
    if current is None or previous is None:
        return None
    growth = current - previous
    return growth if growth >= 0 else None
