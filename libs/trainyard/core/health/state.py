"""The node health state machine.

    healthy -> suspect -> cordoned -> draining -> repair -> healthy
    A fatal finding takes a healthy, suspect or cordoned node straight to draining.
    lost: no heartbeat; the node comes back through repair once it reports again.
    A loss withdrawn because the same boot heartbeats again (a false alarm)
    does not count as an incident toward the lemon rule.

A node returns to healthy only through passing checks (from suspect or repair)
or an operator's uncordon.  ``transition`` never raises for an input that does
not apply: it returns the record unchanged with a ``TransitionRejected`` action
that says why.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from trainyard.core.health.actions import (
    Action,
    Alert,
    CordonNode,
    FailRunsOnNode,
    PreemptRunsOnNode,
    RebootNode,
    ResetGpu,
    RunHealthChecks,
    TransitionRejected,
    UncordonNode,
)
from trainyard.core.health.commands import (
    ChecksFailed,
    ChecksPassed,
    Command,
    Cordon,
    Drain,
    DrainComplete,
    HeartbeatResumed,
    Uncordon,
)
from trainyard.core.health.findings import REMEDY_ORDER, Finding, FindingKind, Remedy, Severity, strongest_remedy
from trainyard.core.health.rules import DEFAULT_POLICY, HealthPolicy
from trainyard.domain.node import NodeState

AUTOMATION = "automation"
_IN_SERVICE = (NodeState.HEALTHY, NodeState.SUSPECT, NodeState.CORDONED)  # runs may still be on the node


class HistoryEntry(msgspec.Struct, frozen=True):
    at: float
    from_state: NodeState
    to_state: NodeState
    cause: str  # the input: a finding kind or a command name
    detail: str


class NodeHealthRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What the health service keeps per node."""

    node_id: str
    state: NodeState = NodeState.HEALTHY
    since: float = 0.0  # when the node entered its state
    reason: str = ""  # why it is in that state
    remedy: Remedy | None = None  # what repair must do for the current incident
    gpus: tuple[int, ...] = ()  # GPUs named by findings of the current incident
    cordoned_by: str | None = None  # "automation" or "operator:<name>" while cordoned
    suspect_causes: tuple[str, ...] = ()  # distinct "kind:gpu" causes in this suspect episode
    suspect_entries: tuple[float, ...] = ()  # when the node last entered suspect (for flapping)
    incidents: tuple[float, ...] = ()  # fatal incidents within the lemon window
    lemon: bool = False  # too many incidents: stays in repair until an operator uncordons
    expected_gpus: int | None = None  # GPUs the node registered with
    loss_incident: float | None = None  # the incident the current loss added, withdrawn if it was a false alarm
    lemon_before_loss: bool = False  # the lemon mark before the current loss
    history: tuple[HistoryEntry, ...] = ()  # most recent last, bounded by the policy
    version: int = 0  # bumped on every accepted change


Result = tuple[NodeHealthRecord, tuple[Action, ...]]


def transition(
    record: NodeHealthRecord, event: Finding | Command, now: float, policy: HealthPolicy = DEFAULT_POLICY
) -> Result:
    """Apply one finding or command to a node's record."""
    node_id = getattr(event, "node_id", None)
    if node_id != record.node_id:
        return _reject(record, event, f"input is about node {node_id!r}")
    if isinstance(event, Finding):
        return _on_finding(record, event, now, policy)
    handler = _HANDLERS.get(type(event))
    if handler is None:
        return _reject(record, event, "unknown input")
    return handler(record, event, now, policy)


# --- findings -----------------------------------------------------------------


def _on_finding(record: NodeHealthRecord, finding: Finding, now: float, policy: HealthPolicy) -> Result:
    state, node = record.state, record.node_id
    if finding.kind == FindingKind.HEARTBEAT_TIMEOUT:
        if state == NodeState.LOST:
            return record, ()
        actions: list[Action] = []
        if state in (NodeState.HEALTHY, NodeState.SUSPECT):
            actions.append(CordonNode(node_id=node, reason=finding.message, by=AUTOMATION))
        if state in _IN_SERVICE or state == NodeState.DRAINING:
            actions.append(FailRunsOnNode(node_id=node, reason="node_failure"))
        actions.append(Alert(severity="page", summary=f"node {node} lost: {finding.message}", node_id=node))
        lost = _move(record, NodeState.LOST, now, finding, policy, incident=state in _IN_SERVICE)
        lost = msgspec.structs.replace(
            lost, loss_incident=now if state in _IN_SERVICE else None, lemon_before_loss=record.lemon
        )
        return lost, tuple(actions)
    if state == NodeState.LOST:
        return record, ()  # nothing more to learn until the node reports again

    if finding.severity == Severity.FATAL:
        if state in _IN_SERVICE:
            actions = (
                [] if state == NodeState.CORDONED else [CordonNode(node_id=node, reason=finding.message, by=AUTOMATION)]
            )
            actions += [
                FailRunsOnNode(node_id=node, reason="node_failure"),
                Alert(severity="page", summary=f"node {node} isolated: {finding.message}", node_id=node),
            ]
            return _move(record, NodeState.DRAINING, now, finding, policy, incident=True), tuple(actions)
        return _note(record, finding), ()  # already isolated: only the remedy may grow

    if finding.severity == Severity.SUSPECT:
        if state == NodeState.HEALTHY:
            entries = _within(record.suspect_entries, now, policy.flap_window_s) + (now,)
            if len(entries) >= policy.flap_limit:
                moved = _move(record, NodeState.CORDONED, now, finding, policy, detail="flapping: " + finding.message)
                moved = msgspec.structs.replace(moved, suspect_entries=entries, cordoned_by=AUTOMATION)
                return moved, (
                    CordonNode(node_id=node, reason=f"flapping: suspect {len(entries)} times", by=AUTOMATION),
                    Alert(severity="warning", summary=f"node {node} flaps between suspect and healthy", node_id=node),
                )
            moved = _move(record, NodeState.SUSPECT, now, finding, policy)
            moved = msgspec.structs.replace(moved, suspect_entries=entries, suspect_causes=(_cause(finding),))
            return moved, (RunHealthChecks(node_id=node, reason=finding.message),)
        if state == NodeState.SUSPECT:
            causes = tuple(dict.fromkeys(record.suspect_causes + (_cause(finding),)))
            if len(causes) >= policy.suspect_causes_to_cordon:
                moved = _move(record, NodeState.CORDONED, now, finding, policy)
                moved = msgspec.structs.replace(moved, suspect_causes=causes, cordoned_by=AUTOMATION)
                return moved, (
                    CordonNode(node_id=node, reason=f"{len(causes)} distinct suspect findings", by=AUTOMATION),
                    Alert(severity="warning", summary=f"node {node} cordoned: {finding.message}", node_id=node),
                )
            noted = _note(record, finding)
            if causes == record.suspect_causes:
                return noted, ()
            return msgspec.structs.replace(noted, suspect_causes=causes, version=record.version + 1), ()
        return _note(record, finding), ()

    # Informational: the node stays as it is; a job-level remedy restarts the affected runs.
    if finding.action == Remedy.RESTART_JOB and state in _IN_SERVICE:
        return record, (FailRunsOnNode(node_id=node, reason="gpu_error", gpu=finding.gpu),)
    return record, ()


def _note(record: NodeHealthRecord, finding: Finding) -> NodeHealthRecord:
    """Fold a finding's remedy and GPU into the current incident without changing state."""
    remedy = strongest_remedy(record.remedy, finding.action)
    gpus = _add_gpu(record.gpus, finding.gpu)
    if remedy == record.remedy and gpus == record.gpus:
        return record
    return msgspec.structs.replace(record, remedy=remedy, gpus=gpus, version=record.version + 1)


# --- commands -----------------------------------------------------------------


def _cordon(record: NodeHealthRecord, cmd: Cordon, now: float, policy: HealthPolicy) -> Result:
    if record.state not in (NodeState.HEALTHY, NodeState.SUSPECT):
        return _reject(record, cmd, f"cannot cordon a {record.state.value} node")
    moved = _move(record, NodeState.CORDONED, now, cmd, policy, detail=cmd.reason)
    return msgspec.structs.replace(moved, cordoned_by=cmd.by), (
        CordonNode(node_id=record.node_id, reason=cmd.reason, by=cmd.by),
    )


def _uncordon(record: NodeHealthRecord, cmd: Uncordon, now: float, policy: HealthPolicy) -> Result:
    if not cmd.by.startswith("operator:"):
        return _reject(record, cmd, "only an operator uncordons; automation returns a node through passing checks")
    if record.state == NodeState.HEALTHY:
        return _reject(record, cmd, "node is already healthy")
    if record.state == NodeState.LOST:
        return _reject(record, cmd, "node is not reporting; it returns through repair once it heartbeats again")
    moved = _back_in_service(record, now, cmd, policy, detail=f"uncordoned by {cmd.by}: {cmd.reason}")
    # The operator takes responsibility for the node: its incident count starts afresh.
    moved = msgspec.structs.replace(moved, incidents=(), lemon=False, suspect_entries=())
    return moved, (UncordonNode(node_id=record.node_id, reason=cmd.reason, by=cmd.by),)


def _drain(record: NodeHealthRecord, cmd: Drain, now: float, policy: HealthPolicy) -> Result:
    if record.state not in _IN_SERVICE:
        return _reject(record, cmd, f"cannot drain a {record.state.value} node")
    actions: list[Action] = []
    if record.state != NodeState.CORDONED:
        actions.append(CordonNode(node_id=record.node_id, reason=cmd.reason, by=cmd.by))
    actions.append(PreemptRunsOnNode(node_id=record.node_id, reason=cmd.reason))
    moved = _move(record, NodeState.DRAINING, now, cmd, policy, detail=cmd.reason)
    return msgspec.structs.replace(moved, cordoned_by=record.cordoned_by or cmd.by), tuple(actions)


def _drain_complete(record: NodeHealthRecord, cmd: DrainComplete, now: float, policy: HealthPolicy) -> Result:
    if record.state != NodeState.DRAINING:
        return _reject(record, cmd, f"node is {record.state.value}, not draining")
    moved = _move(record, NodeState.REPAIR, now, cmd, policy, detail=f"remedy: {_remedy_name(record.remedy)}")
    return moved, _repair_actions(moved)


def _checks_passed(record: NodeHealthRecord, cmd: ChecksPassed, now: float, policy: HealthPolicy) -> Result:
    if record.state == NodeState.SUSPECT:
        return _back_in_service(record, now, cmd, policy, detail="health checks passed"), ()
    if record.state != NodeState.REPAIR:
        return _reject(record, cmd, f"checks do not return a {record.state.value} node to service")
    if record.lemon:
        return record, (
            Alert(
                severity="warning",
                node_id=record.node_id,
                summary=f"node {record.node_id} passed checks but had {len(record.incidents)} incidents "
                f"in {policy.lemon_window_s / 86400:.0f} days; it stays in repair until an operator uncordons it",
            ),
        )
    moved = _back_in_service(record, now, cmd, policy, detail="health checks passed after repair")
    return moved, (UncordonNode(node_id=record.node_id, reason="health checks passed", by=AUTOMATION),)


def _checks_failed(record: NodeHealthRecord, cmd: ChecksFailed, now: float, policy: HealthPolicy) -> Result:
    node = record.node_id
    if record.state == NodeState.SUSPECT:
        moved = msgspec.structs.replace(
            _move(record, NodeState.CORDONED, now, cmd, policy, detail=cmd.reason), cordoned_by=AUTOMATION
        )
        return moved, (
            CordonNode(node_id=node, reason=f"health checks failed: {cmd.reason}", by=AUTOMATION),
            Alert(
                severity="warning", summary=f"node {node} cordoned: health checks failed: {cmd.reason}", node_id=node
            ),
        )
    if record.state != NodeState.REPAIR:
        return _reject(record, cmd, f"no checks are expected from a {record.state.value} node")
    # Escalate: the next stronger remedy, up to hands-on repair.
    current = record.remedy if record.remedy in REMEDY_ORDER[2:] else Remedy.RESTART_JOB
    stronger = REMEDY_ORDER[min(REMEDY_ORDER.index(current) + 1, len(REMEDY_ORDER) - 1)]
    moved = msgspec.structs.replace(
        record,
        remedy=stronger,
        reason=f"checks failed: {cmd.reason}",
        history=_history(
            record, now, record.state, "ChecksFailed", f"{cmd.reason}; escalating to {stronger.value}", policy
        ),
        version=record.version + 1,
    )
    return moved, _repair_actions(moved)


def _heartbeat_resumed(record: NodeHealthRecord, cmd: HeartbeatResumed, now: float, policy: HealthPolicy) -> Result:
    if record.state != NodeState.LOST:
        return _reject(record, cmd, f"node is {record.state.value}, not lost")
    detail = "agent reports again (same boot: false alarm, not an incident)" if cmd.same_boot else "agent reports again"
    moved = _move(record, NodeState.REPAIR, now, cmd, policy, detail=detail)
    if cmd.same_boot and record.loss_incident is not None:
        incidents = tuple(t for t in moved.incidents if t != record.loss_incident)
        moved = msgspec.structs.replace(moved, incidents=incidents, lemon=record.lemon_before_loss)
    moved = msgspec.structs.replace(moved, loss_incident=None, lemon_before_loss=False)
    return moved, (RunHealthChecks(node_id=record.node_id, reason="node was lost"),)


# Each handler takes the command of its own type (the key), hence ``Any`` for that argument.
_HANDLERS: dict[type[Command], Callable[[NodeHealthRecord, Any, float, HealthPolicy], Result]] = {
    Cordon: _cordon,
    Uncordon: _uncordon,
    Drain: _drain,
    DrainComplete: _drain_complete,
    ChecksPassed: _checks_passed,
    ChecksFailed: _checks_failed,
    HeartbeatResumed: _heartbeat_resumed,
}


# --- record bookkeeping -------------------------------------------------------


def _repair_actions(record: NodeHealthRecord) -> tuple[Action, ...]:
    node = record.node_id
    if record.remedy == Remedy.DRAIN_NOW:
        return (Alert(severity="page", summary=f"node {node} needs hands-on repair: {record.reason}", node_id=node),)
    actions: list[Action] = []
    if record.remedy == Remedy.RESET_GPU:
        actions += [ResetGpu(node_id=node, gpu=g) for g in record.gpus] or [ResetGpu(node_id=node)]
    elif record.remedy == Remedy.REBOOT_NODE:
        actions.append(RebootNode(node_id=node))
    actions.append(RunHealthChecks(node_id=node, reason=f"repair ({_remedy_name(record.remedy)})"))
    return tuple(actions)


def _move(
    record: NodeHealthRecord,
    to: NodeState,
    now: float,
    cause: Finding | Command,
    policy: HealthPolicy,
    *,
    incident: bool = False,
    detail: str | None = None,
) -> NodeHealthRecord:
    if isinstance(cause, Finding):
        name, text = cause.kind.value, detail or cause.message
        remedy, gpus = strongest_remedy(record.remedy, cause.action), _add_gpu(record.gpus, cause.gpu)
    else:
        name, text = type(cause).__name__, detail or ""
        remedy, gpus = record.remedy, record.gpus
    incidents, lemon = record.incidents, record.lemon
    if incident:
        incidents = _within(incidents, now, policy.lemon_window_s) + (now,)
        lemon = lemon or len(incidents) >= policy.lemon_incidents
    return msgspec.structs.replace(
        record,
        state=to,
        since=now,
        reason=text,
        remedy=remedy,
        gpus=gpus,
        incidents=incidents,
        lemon=lemon,
        history=_history(record, now, to, name, text, policy),
        version=record.version + 1,
    )


def _back_in_service(
    record: NodeHealthRecord, now: float, cause: Command, policy: HealthPolicy, detail: str
) -> NodeHealthRecord:
    moved = _move(record, NodeState.HEALTHY, now, cause, policy, detail=detail)
    return msgspec.structs.replace(moved, remedy=None, gpus=(), cordoned_by=None, suspect_causes=())


def _history(
    record: NodeHealthRecord, now: float, to: NodeState, cause: str, detail: str, policy: HealthPolicy
) -> tuple[HistoryEntry, ...]:
    entry = HistoryEntry(at=now, from_state=record.state, to_state=to, cause=cause, detail=detail)
    return (record.history + (entry,))[-policy.history_limit :]


def _reject(record: NodeHealthRecord, event: Finding | Command, reason: str) -> Result:
    name = event.kind.value if isinstance(event, Finding) else type(event).__name__
    return record, (TransitionRejected(node_id=record.node_id, state=record.state.value, input=name, reason=reason),)


def _within(times: tuple[float, ...], now: float, window: float) -> tuple[float, ...]:
    return tuple(t for t in times if now - t < window)


def _cause(finding: Finding) -> str:
    return f"{finding.kind.value}:{'node' if finding.gpu is None else finding.gpu}"


def _add_gpu(gpus: tuple[int, ...], gpu: int | None) -> tuple[int, ...]:
    return gpus if gpu is None or gpu in gpus else tuple(sorted(gpus + (gpu,)))


def _remedy_name(remedy: Remedy | None) -> str:
    return "checks only" if remedy is None else remedy.value
