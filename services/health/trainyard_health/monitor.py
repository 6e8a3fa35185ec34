"""Health's decisions, carried out: findings and commands in; node state
changes, run failures, checks, alerts and audit records out.

Every decision goes through the pure core in five steps:

1. correlate the new findings with the fleet's recent ones (rack faults are
   raised once, and their findings withheld);
2. run each node's findings or command through ``transition``;
3. hold back automated isolations beyond the blast-radius limit;
4. publish each state change on the NODES stream and wait until the shared
   projection shows it, so no placement can pick the node again;
5. only then fail the runs on an isolated node (``RunFailed(node_failure)``,
   message id ``<run_id>:failed``, fenced by the job's last sequence so it can
   only fail the run it is about: see ``fencing``), so the whole gang is
   requeued and placed on healthy nodes; then store the record.

Message ids derive from the record version, so a retried batch publishes
nothing twice.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from trainyard.bus import Bus
from trainyard.bus.audit import audit
from trainyard.core.health import (
    Alert,
    CordonNode,
    Decision,
    FailRunsOnNode,
    Finding,
    HealthPolicy,
    NodeHealthRecord,
    PreemptRunsOnNode,
    RebootNode,
    ResetGpu,
    RunHealthChecks,
    Severity,
    TransitionRejected,
    UncordonNode,
    correlate,
    limit_blast_radius,
    rack_fault_alert,
    transition,
)
from trainyard.core.health.commands import Command
from trainyard.domain.node import SCHEDULABLE_STATES, NodeInfo
from trainyard.events import subjects
from trainyard.events.nodes import NodeStateChanged
from trainyard.observability.logs import kv
from trainyard.store import Projector, Store, views
from trainyard.store.cache import ProjectionCache
from trainyard_health.agents import reset_gpu
from trainyard_health.fencing import ACTIVE, fail_runs_fenced
from trainyard_health.metrics import HealthMetrics
from trainyard_health.records import RecordStore

log = logging.getLogger(__name__)

__all__ = ["ACTIVE", "Monitor", "StateHook"]
#: Called (in a thread) with every state change, e.g. to taint the Kubernetes node.
StateHook = Callable[[NodeStateChanged], Any]


class Monitor:
    def __init__(
        self,
        bus: Bus,
        store: Store,
        policy: HealthPolicy,
        clock: Callable[[], float],
        *,
        metrics: HealthMetrics | None = None,
        nodes: Projector | None = None,
        hook: StateHook | None = None,
    ) -> None:
        self.bus = bus
        self.store = store
        self.records = RecordStore(store)
        self.policy = policy
        self.clock = clock
        self.metrics = metrics or HealthMetrics()
        self.nodes = nodes  # this process's NODES projector, to wait for our own state changes
        self.hook = hook
        self.lock = asyncio.Lock()  # one decision at a time in this process
        self.roster = ProjectionCache(
            store, "nodes", views.read_roster, views.Roster()
        )  # kept while NODES stands still

    async def fleet(self) -> tuple[dict[str, NodeInfo], dict[str, str]]:
        """Every registered node's info and projected state (copies: callers may change them)."""
        roster = await self.roster.get()
        return roster.infos, roster.states

    # --- inputs ---

    async def on_findings(self, findings: Sequence[Finding], *, limited: bool = True) -> None:
        """Apply findings; ``limited=False`` skips correlation and the blast radius (a node already lost)."""
        if not findings:
            return
        for f in findings:
            self.metrics.findings.labels(f.kind.value, f.severity.value).inc()
        now = self.clock()
        async with self.lock:
            infos, states = await self.fleet()
            kept = list(findings)
            # 1. Rack correlation over the fleet's recent findings.
            if limited:
                serious = [f for f in findings if f.severity != Severity.INFO]
                recent = await self.records.recent_findings(serious, now, self.policy.rack_fault_window_s)
                _, faults = correlate(recent, infos, self.policy, now)
                withheld = {n for fault in faults for n in fault.node_ids}
                for fault in faults:
                    if await self.records.once(f"rack:{fault.rack}", self.policy.rack_fault_window_s):
                        self.metrics.rack_faults.inc()
                        await self._alert(rack_fault_alert(fault), now)
                kept = [f for f in findings if not (f.severity != Severity.INFO and f.node_id in withheld)]
            # 2. Each node's findings through the state machine.
            records = await self.records.load_all(states)
            decisions, observed = [], {}
            by_node: dict[str, list[Finding]] = {}
            for f in kept:
                by_node.setdefault(f.node_id, []).append(f)
            for node_id, node_findings in by_node.items():
                if node_id not in infos:
                    log.warning("findings about unknown node %s ignored", node_id)
                    continue
                before = self._with_gpus(records[node_id], infos[node_id])
                after, actions = before, []
                for f in node_findings:
                    after, more = transition(after, f, now, self.policy)
                    actions += more
                decisions.append(Decision(before=before, after=after, actions=tuple(actions)))
                observed[node_id] = min(f.at for f in node_findings)
            # 3-5.
            await self._carry_out(decisions, records, infos, now, observed, limited=limited)

    async def on_command(self, command: Command, by: str = "automation") -> NodeHealthRecord | None:
        """Apply an operator's or the repair loop's command to one node."""
        now = self.clock()
        async with self.lock:
            infos, states = await self.fleet()
            if command.node_id not in infos:
                log.warning("%s for unknown node %s ignored", type(command).__name__, command.node_id)
                return None
            records = await self.records.load_all(states)
            before = self._with_gpus(records[command.node_id], infos[command.node_id])
            after, actions = transition(before, command, now, self.policy)
            decision = Decision(before=before, after=after, actions=actions, automated=not by.startswith("operator:"))
            await self._carry_out([decision], records, infos, now, {}, limited=True)
            return after

    def _with_gpus(self, record: NodeHealthRecord, info: NodeInfo) -> NodeHealthRecord:
        if record.expected_gpus == info.gpus:
            return record
        return msgspec.structs.replace(record, expected_gpus=info.gpus)

    # --- effects ---

    async def _carry_out(
        self,
        decisions: list[Decision],
        records: dict[str, NodeHealthRecord],
        infos: dict[str, NodeInfo],
        now: float,
        observed: dict[str, float],
        *,
        limited: bool,
    ) -> None:
        if limited:
            allowed = limit_blast_radius(decisions, records, infos, self.policy)
            self.metrics.held.inc(sum(1 for a, d in zip(allowed, decisions, strict=True) if a.after is not d.after))
            decisions = allowed
        for decision in decisions:
            await self._apply(decision, infos[decision.node_id], now, observed.get(decision.node_id))

    async def _apply(self, d: Decision, info: NodeInfo, now: float, observed_at: float | None) -> None:
        before, after = d.before, d.after
        event = await self._publish_state(d, info, now, observed_at) if after.state != before.state else None
        for action in d.actions:
            await self._act(action, info, now)
        await self.records.save(before, after)
        if event is not None and self.hook is not None:
            try:
                await asyncio.to_thread(self.hook, event)
            except Exception as err:  # noqa: BLE001 - the node is isolated in Trainyard either way
                log.warning("state hook failed for %s: %r", info.node_id, err)

    async def _publish_state(
        self, d: Decision, info: NodeInfo, now: float, observed_at: float | None
    ) -> NodeStateChanged:
        before, after = d.before, d.after
        by = next((a.by for a in d.actions if isinstance(a, CordonNode | UncordonNode)), None)
        by = by or after.cordoned_by or "automation"
        fatal = any(isinstance(a, FailRunsOnNode) and a.reason == "node_failure" for a in d.actions)
        event = NodeStateChanged(
            at=now,
            node_id=info.node_id,
            cluster=info.cluster,
            state=after.state.value,
            previous=before.state.value,
            reason=after.reason,
            cause=after.history[-1].cause if after.history else "",
            by=by,
            observed_at=observed_at,
            fatal=fatal,
        )
        ack = await self.bus.publish(
            subjects.node(info.cluster, info.node_id), event, msg_id=f"state:{info.node_id}:{after.version}"
        )
        if self.nodes is not None:
            try:
                await self.nodes.wait_for(ack.seq, timeout=5.0)
            except TimeoutError:
                log.warning("NODES projection has not applied seq %d yet", ack.seq)
        self.metrics.transitions.labels(
            after.state.value, "operator" if by.startswith("operator:") else "automation"
        ).inc()
        if before.state in SCHEDULABLE_STATES and after.state not in SCHEDULABLE_STATES and observed_at is not None:
            self.metrics.time_to_isolate.observe(max(0.0, self.clock() - observed_at))
        level = logging.WARNING if after.state not in SCHEDULABLE_STATES else logging.INFO
        log.log(
            level,
            "node %s: %s -> %s (%s)",
            info.node_id,
            before.state.value,
            after.state.value,
            after.reason,
            extra=kv(
                decision=f"node_{after.state.value}",
                node=info.node_id,
                state=after.state.value,
                previous=before.state.value,
                reason=after.reason,
                cause=event.cause,
                by=by,
            ),
        )
        actor = by if by.startswith("operator:") else "service:health"
        await audit(
            self.bus,
            actor,
            f"node.{after.state.value}",
            info.node_id,
            after.reason,
            details={"from": before.state.value, "cause": event.cause},
            at=now,
            record_id=f"audit:state:{info.node_id}:{after.version}",
        )
        return event

    async def _act(self, action: Any, info: NodeInfo, now: float) -> None:
        node = info.node_id
        if isinstance(action, FailRunsOnNode):
            if action.reason == "node_failure":
                await self.fail_runs(node, "node_failure", f"node {node} isolated: fault on the node")
            else:  # an application-level XID: only the runs on that GPU
                await self.fail_runs(
                    node, "workload_error", f"GPU {action.gpu} of {node} reported an application error", gpu=action.gpu
                )
        elif isinstance(action, PreemptRunsOnNode):
            await self.fail_runs(node, "preempted", f"node {node} drained: {action.reason}")
        elif isinstance(action, RunHealthChecks):
            await self.records.want_checks(node, action.reason)
        elif isinstance(action, ResetGpu):
            await reset_gpu(self.bus, info, action.gpu)
        elif isinstance(action, RebootNode):
            await self._alert(Alert(severity="warning", summary=f"node {node} needs a reboot", node_id=node), now)
        elif isinstance(action, Alert):
            await self._alert(action, now)
        elif isinstance(action, TransitionRejected):
            log.info("node %s (%s): %s not applied: %s", node, action.state, action.input, action.reason)

    async def fail_runs(self, node_id: str, reason: str, message: str, gpu: int | None = None) -> int:
        """Fail the current active run of every job on the node (or on one GPU of it), fenced by the
        job's last sequence so a run that ended or a newer run is never failed (see ``fencing``)."""
        failed = await fail_runs_fenced(self.bus, self.store, self.clock, node_id, reason, message, gpu)
        if failed:
            self.metrics.runs_failed.labels(reason).inc(failed)
        return failed

    async def _alert(self, alert: Alert, now: float) -> None:
        # The same alert again within a minute (a condition seen on every sample) is not repeated.
        if not await self.records.once(f"alert:{alert.node_id}:{alert.severity}:{hash(alert.summary)}", 60.0):
            return
        self.metrics.alerts.labels(alert.severity).inc()
        (log.error if alert.severity == "page" else log.warning)("ALERT %s: %s", alert.severity, alert.summary)
        target = alert.node_id or alert.rack or alert.pool or "fleet"
        await audit(self.bus, "service:health", f"health.alert.{alert.severity}", target, alert.summary, at=now)
