"""Builders for the health tests: healthy defaults, override what the case is about."""

from __future__ import annotations

from trainyard.core.health import Finding, FindingKind, NodeHealthRecord, Remedy, Severity
from trainyard.domain.node import NodeInfo, NodeState
from trainyard.gpu import GpuSample, NodeSample, NvLinkErrorCounts


def gpu(index: int = 0, **overrides) -> GpuSample:
    """A healthy H100-like GPU reading."""
    fields = dict(
        index=index,
        uuid=f"GPU-{index:04d}",
        name="NVIDIA H100 80GB HBM3",
        temperature_c=50.0,
        power_w=300.0,
        ecc_corrected_volatile=0,
        ecc_uncorrected_volatile=0,
        ecc_corrected_aggregate=0,
        ecc_uncorrected_aggregate=0,
        row_remap_pending=False,
        row_remap_failed=False,
        clock_event_reasons=0,
        clock_event_reason_names=[],
        nvlink_links_up=list(range(18)),
        nvlink_links_down=[],
        nvlink_error_counts=NvLinkErrorCounts(0, 0, 0),
        pcie_replay_counter=0,
        recovery_action="none",
    )
    fields.update(overrides)
    return GpuSample(**fields)


def sample(at: float = 0.0, node: str = "n1", gpus: int = 8, **on_gpu0) -> NodeSample:
    """A node reading; keyword arguments override GPU 0."""
    return NodeSample(node_id=node, at=at, gpus=[gpu(0, **on_gpu0)] + [gpu(i) for i in range(1, gpus)])


def record(node: str = "n1", state: NodeState = NodeState.HEALTHY, **overrides) -> NodeHealthRecord:
    return NodeHealthRecord(node_id=node, state=state, **overrides)


def finding(
    severity: Severity = Severity.SUSPECT,
    action: Remedy = Remedy.RESET_GPU,
    kind: FindingKind = FindingKind.XID,
    node: str = "n1",
    gpu: int | None = 0,
    at: float = 0.0,
) -> Finding:
    return Finding(
        node_id=node, gpu=gpu, kind=kind, severity=severity, action=action, message=f"{kind.value} test", at=at
    )


def fatal(**kw) -> Finding:
    return finding(severity=Severity.FATAL, **kw)


def nodes(
    count: int, rack: str = "r1", pool: str = "p1", prefix: str | None = None, gpus: int = 8
) -> dict[str, NodeInfo]:
    prefix = prefix or f"{rack}-n"
    return {
        f"{prefix}{i}": NodeInfo(
            node_id=f"{prefix}{i}",
            cluster="c1",
            gpu_type="h100",
            gpus=gpus,
            rack=rack,
            labels={"trainyard.io/pool": pool},
        )
        for i in range(count)
    }
