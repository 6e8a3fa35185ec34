"""Fleet-wide rules: correlated failures and the blast-radius limit.

Per-node rules see one node at a time.  Two things need the whole fleet:

1. When many nodes of one rack fail within a short window, the likely cause is
   shared (top-of-rack switch, power, cooling): one ``SuspectedRackFault`` is
   raised for a person instead of blaming, draining and repairing each node.
2. A wrong rule or a monitoring outage must not empty a pool: automation may
   take at most a configured share of a pool out of service.  A decision that
   would go beyond it is replaced by an alert; operators are not limited.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import msgspec

from trainyard.core.health.actions import Action, Alert
from trainyard.core.health.findings import Finding, Severity
from trainyard.core.health.rules import HealthPolicy
from trainyard.core.health.state import NodeHealthRecord
from trainyard.domain.node import SCHEDULABLE_STATES, NodeInfo, NodeState


class SuspectedRackFault(msgspec.Struct, frozen=True):
    """Many nodes of one rack failed together; the rack, not the nodes, is suspect."""

    rack: str
    node_ids: tuple[str, ...]
    kinds: tuple[str, ...]  # finding kinds seen, sorted
    first_at: float
    last_at: float
    message: str
    severity: Severity = Severity.SUSPECT


def correlate(
    findings: Sequence[Finding], nodes: Mapping[str, NodeInfo], policy: HealthPolicy, now: float
) -> tuple[list[Finding], list[SuspectedRackFault]]:
    """Split recent findings into those to apply per node and suspected rack faults.

    Findings of a rack with at least ``rack_fault_min_nodes`` distinct failing
    nodes (suspect or fatal, within ``rack_fault_window_s`` of ``now``) are
    withheld and replaced by one SuspectedRackFault per rack.  Informational
    findings, findings of unknown nodes and older findings pass through.
    """
    # 1. Failing nodes per rack, within the window.
    failing: dict[str, dict[str, list[Finding]]] = {}
    for finding in findings:
        node = nodes.get(finding.node_id)
        if node is None or finding.severity == Severity.INFO or now - finding.at > policy.rack_fault_window_s:
            continue
        failing.setdefault(node.rack, {}).setdefault(finding.node_id, []).append(finding)
    # 2. Racks over the threshold.
    faults: list[SuspectedRackFault] = []
    withheld: set[str] = set()
    for rack in sorted(failing):
        by_node = failing[rack]
        if len(by_node) < policy.rack_fault_min_nodes:
            continue
        rack_findings = [f for fs in by_node.values() for f in fs]
        node_ids = tuple(sorted(by_node))
        in_rack = sum(1 for n in nodes.values() if n.rack == rack)
        faults.append(
            SuspectedRackFault(
                rack=rack,
                node_ids=node_ids,
                kinds=tuple(sorted({f.kind.value for f in rack_findings})),
                first_at=min(f.at for f in rack_findings),
                last_at=max(f.at for f in rack_findings),
                message=f"{len(node_ids)} of {in_rack} nodes in rack {rack} failed within "
                f"{policy.rack_fault_window_s:.0f} s; suspect the rack (switch, power, cooling)",
            )
        )
        withheld.update(node_ids)
    # 3. Everything else passes through, in order.
    kept = [
        f
        for f in findings
        if not (f.node_id in withheld and f.severity != Severity.INFO and now - f.at <= policy.rack_fault_window_s)
    ]
    return kept, faults


def rack_fault_alert(fault: SuspectedRackFault) -> Alert:
    return Alert(severity="page", summary=fault.message + f" (nodes: {', '.join(fault.node_ids)})", rack=fault.rack)


# --- blast radius ---------------------------------------------------------------


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """The outcome of ``transition`` for one node, before it is stored and carried out."""

    before: NodeHealthRecord
    after: NodeHealthRecord
    actions: tuple[Action, ...]
    automated: bool = True  # False for an operator's command

    @property
    def node_id(self) -> str:
        return self.before.node_id

    @property
    def takes_out_of_service(self) -> bool:
        return self.before.state in SCHEDULABLE_STATES and self.after.state not in SCHEDULABLE_STATES


def pool_of(node: NodeInfo, policy: HealthPolicy) -> str:
    return node.labels.get(policy.pool_label) or f"{node.cluster}/{node.gpu_type}"


def pool_limit(pool_size: int, policy: HealthPolicy) -> int:
    """How many nodes of a pool may be out of service before automation stops."""
    return max(policy.blast_radius_min_nodes, math.floor(policy.blast_radius_max_share * pool_size))


# Worse first: a lost or failed node gets the budget before a suspect one.
_URGENCY = {NodeState.LOST: 0, NodeState.DRAINING: 1, NodeState.REPAIR: 2, NodeState.CORDONED: 3, NodeState.SUSPECT: 4}


def limit_blast_radius(
    decisions: Sequence[Decision],
    records: Mapping[str, NodeHealthRecord],
    nodes: Mapping[str, NodeInfo],
    policy: HealthPolicy,
) -> list[Decision]:
    """Hold back automated decisions that would take too much of a pool out of service.

    ``records`` holds the current record of every node (the state the batch
    starts from); ``decisions`` holds at most one decision per node.  A held
    decision keeps the node's record as it was and carries one alert instead.
    Decisions are returned in the order given.
    """
    seen = [d.node_id for d in decisions]
    if len(seen) != len(set(seen)):
        raise ValueError("at most one decision per node in a batch")
    # 1. Pool sizes and nodes out of service before the batch.
    size: dict[str, int] = {}
    out: dict[str, int] = {}
    for node_id, node in nodes.items():
        pool = pool_of(node, policy)
        size[pool] = size.get(pool, 0) + 1
        record = records.get(node_id)
        if record is not None and record.state not in SCHEDULABLE_STATES:
            out[pool] = out.get(pool, 0) + 1
    # 2. Decisions that free capacity or come from operators apply first.
    result: dict[int, Decision] = {}
    limited: list[tuple[int, Decision]] = []
    for i, decision in enumerate(decisions):
        known = nodes.get(decision.node_id)
        known_pool = pool_of(known, policy) if known is not None else None
        if decision.automated and decision.takes_out_of_service and known_pool is not None:
            limited.append((i, decision))
            continue
        result[i] = decision
        if known_pool is not None:
            was_out = decision.before.state not in SCHEDULABLE_STATES
            is_out = decision.after.state not in SCHEDULABLE_STATES
            out[known_pool] = out.get(known_pool, 0) + int(is_out) - int(was_out)
    # 3. Automated isolations, most urgent first, while the pool has room.
    limited.sort(key=lambda item: (_URGENCY.get(item[1].after.state, 9), item[1].node_id))
    for i, decision in limited:
        pool = pool_of(nodes[decision.node_id], policy)
        limit = pool_limit(size[pool], policy)
        if out.get(pool, 0) + 1 <= limit:
            out[pool] = out.get(pool, 0) + 1
            result[i] = decision
            continue
        result[i] = Decision(
            before=decision.before,
            after=decision.before,
            automated=decision.automated,
            actions=(
                Alert(
                    severity="page",
                    node_id=decision.node_id,
                    pool=pool,
                    summary=f"blast-radius limit: {out.get(pool, 0)} of {size[pool]} nodes in pool {pool} are out of "
                    f"service (limit {limit}); not moving {decision.node_id} to {decision.after.state.value} "
                    f"({decision.after.reason}); a person must decide",
                ),
            ),
        )
    return [result[i] for i in range(len(decisions))]
