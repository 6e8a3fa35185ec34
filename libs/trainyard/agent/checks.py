"""Pre-run, post-run and on-demand health checks of one node's GPUs.

A check reads every GPU once and runs the same pure rules the health service
runs, against a fresh record: a check passes when nothing suspect or fatal is
seen and every GPU the node registered with is visible.  (A real node would
add an active diagnostic such as DCGM level 1 here; the readings are what the
emulator can model.)
"""

from __future__ import annotations

import msgspec

from trainyard.core.health import DEFAULT_POLICY, HealthPolicy, NodeHealthRecord, Severity, evaluate_sample
from trainyard.gpu.nvml import GpuBackend, NodeSample, sample_node


class CheckReport(msgspec.Struct, frozen=True):
    node_id: str
    at: float
    passed: bool
    problems: list[str]  # one line per suspect or fatal finding


def run_checks(
    backend: GpuBackend,
    node_id: str,
    at: float,
    expected_gpus: int | None = None,
    previous: NodeSample | None = None,
    policy: HealthPolicy = DEFAULT_POLICY,
) -> CheckReport:
    sample = sample_node(backend, node_id, at)
    record = NodeHealthRecord(node_id=node_id, expected_gpus=expected_gpus)
    findings = evaluate_sample(record, sample, previous, policy)
    problems = [f"{f.severity.value}: {f.message}" for f in findings if f.severity != Severity.INFO]
    return CheckReport(node_id=node_id, at=at, passed=not problems, problems=problems)
