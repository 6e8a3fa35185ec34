"""What the health core asks the shell to do.  Plain data; the service carries them out."""

from __future__ import annotations

import msgspec


class _Action(msgspec.Struct, tag_field="type", frozen=True, kw_only=True):
    node_id: str


class CordonNode(_Action, tag="CordonNode", frozen=True):
    """Stop placing new work on the node (Kubernetes: cordon and taint)."""

    reason: str
    by: str  # "automation" or "operator:<name>"


class UncordonNode(_Action, tag="UncordonNode", frozen=True):
    reason: str
    by: str


class FailRunsOnNode(_Action, tag="FailRunsOnNode", frozen=True):
    """Fail the runs on the node (or on one GPU) so that admission requeues their jobs."""

    reason: str = "node_failure"
    gpu: int | None = None


class PreemptRunsOnNode(_Action, tag="PreemptRunsOnNode", frozen=True):
    """Evacuate runs gracefully (checkpoint, then stop) for a planned drain."""

    reason: str


class ResetGpu(_Action, tag="ResetGpu", frozen=True):
    gpu: int | None = None  # None: every GPU of the node


class RebootNode(_Action, tag="RebootNode", frozen=True):
    pass


class RunHealthChecks(_Action, tag="RunHealthChecks", frozen=True):
    """Run active checks (for example a DCGM diagnostic) and report ChecksPassed / ChecksFailed."""

    reason: str


class Alert(msgspec.Struct, tag="Alert", tag_field="type", frozen=True, kw_only=True):
    """Tell a person.  ``page`` wakes on-call; ``warning`` goes to the operators' queue."""

    severity: str  # "info" | "warning" | "page"
    summary: str
    node_id: str | None = None
    rack: str | None = None
    pool: str | None = None


class TransitionRejected(_Action, tag="TransitionRejected", frozen=True):
    """An input that does not apply to the node's state; nothing changed.  For the audit log."""

    state: str
    input: str
    reason: str


Action = (
    CordonNode
    | UncordonNode
    | FailRunsOnNode
    | PreemptRunsOnNode
    | ResetGpu
    | RebootNode
    | RunHealthChecks
    | Alert
    | TransitionRejected
)
