"""Metering: what one run cost in GPU time, from its lifecycle events.

Events reach accounting at least once and not necessarily in order, so what
is known about a run (:class:`RunFacts`) is built by :func:`observe`, which is
idempotent and commutative: every field keeps the earliest report of its
kind, and ties are broken by a fixed rank, never by arrival order.  Any
permutation of any multiset of a run's events gives the same facts.

The run's outcome follows the lifecycle fold (:mod:`trainyard.core.lifecycle`)
when the events' stream sequences are known: the fold accepts the first
terminal event of the run in log order (its own success or failure, or a
cancel of its job), so of the terminal reports the one with the lowest
sequence wins, whatever the producers' clocks say.  Without sequences (a
plain list of events) the earliest ``at`` wins.

:func:`meter` turns facts into a :class:`UsageInterval`.  All three measures
are GPU-seconds (seconds x GPUs held):

- ``gpu_seconds``  -- started -> ended: what the tenant is charged for;
- ``idle_seconds`` -- placed -> started: GPUs reserved but not yet working;
- ``lost_seconds`` -- for runs ended by preemption or an infrastructure
  failure, the part of ``gpu_seconds`` since the last checkpoint (the whole
  run when it never checkpointed): work that must be done again.

A run that has not ended is metered up to ``now`` when one is given; nothing
is stored and no clock is read here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

from trainyard.events.jobs import (
    INFRASTRUCTURE_FAILURES,
    JobAccepted,
    JobAdmitted,
    JobCancelled,
    JobEvent,
    JobPlaced,
    JobRejected,
    RunFailed,
    RunStarted,
    RunSucceeded,
)

SUCCEEDED = "succeeded"
CANCELLED = "cancelled"
FAILED = "failed:"  # followed by the failure reason, e.g. "failed:preempted"
UNKNOWN_GPU_TYPE = "unknown"  # GPU type of a run whose job spec has not been seen yet

#: When two different terminal events carry the same time, the lower rank wins.
_OUTCOME_RANK = {"failed": 0, CANCELLED: 1, SUCCEEDED: 2}

#: Role name -> (GPU type, GPUs the role asks for), from the job spec.
RoleGpus = Mapping[str, tuple[str, int]]


class RunFacts(msgspec.Struct, frozen=True, kw_only=True):
    """Everything known about one run, independent of event order."""

    run_id: str
    job_id: str
    tenant: str
    attempt: int | None = None  # from JobAdmitted
    cluster: str | None = None  # from the chosen JobPlaced
    admitted_at: float | None = None  # earliest JobAdmitted
    placed_at: float | None = None  # earliest JobPlaced
    placement: dict[str, int] = {}  # role -> GPUs, from the earliest JobPlaced
    started_at: float | None = None  # earliest RunStarted
    ended_at: float | None = None  # time of the terminal event that ended the run (own or its job's cancel)
    outcome: str | None = None  # outcome of that terminal event; None while open
    ended_seq: int | None = None  # its stream sequence, when known


class UsageInterval(msgspec.Struct, frozen=True, kw_only=True):
    """One run metered: when it held GPUs and what that came to."""

    run_id: str
    job_id: str
    tenant: str
    gpus: int  # GPUs the run held
    gpus_by_type: dict[str, int]  # the same GPUs split by GPU type
    placed_at: float | None
    started_at: float | None
    ended_at: float | None  # None while the run is open
    outcome: str | None  # succeeded | failed:<reason> | cancelled; None while open
    metered_to: float | None  # ended_at, or ``now`` for an open run
    gpu_seconds: float  # GPUs x (metered_to - started_at)
    idle_seconds: float  # GPUs x (started_at, or metered_to if never started, - placed_at)
    lost_seconds: float  # GPUs x time since the last checkpoint, infrastructure failures only
    last_checkpoint_at: float | None = None  # the checkpoint lost work is counted from

    @property
    def open(self) -> bool:
        return self.ended_at is None


def outcome_of(event: JobEvent) -> str | None:
    """The outcome a terminal event records, or None for other events."""
    if isinstance(event, RunSucceeded):
        return SUCCEEDED
    if isinstance(event, RunFailed):
        return FAILED + event.reason
    if isinstance(event, JobCancelled):
        return CANCELLED
    return None


def _rank(outcome: str) -> tuple[int, str]:
    return (_OUTCOME_RANK.get(outcome.split(":", 1)[0], 3), outcome)


def _earliest(current: float | None, at: float) -> float:
    return at if current is None or at < current else current


def _end_key(seq: int | None, at: float, outcome: str) -> tuple[int, int, float, tuple[int, str]]:
    """Which terminal report ends a run: the first in log order, then (for
    reports without a sequence) the earliest, then the lowest outcome rank."""
    return (0, seq, at, _rank(outcome)) if seq is not None else (1, 0, at, _rank(outcome))


def end_run(facts: RunFacts, at: float, outcome: str, seq: int | None = None) -> RunFacts:
    """Record a terminal report with its stream sequence ``seq`` (None when
    unknown); the first in log order wins, else the earliest, ties by rank."""
    if (
        facts.ended_at is not None
        and facts.outcome is not None
        and _end_key(facts.ended_seq, facts.ended_at, facts.outcome) <= _end_key(seq, at, outcome)
    ):
        return facts
    return msgspec.structs.replace(facts, ended_at=at, outcome=outcome, ended_seq=seq)


def _placement_key(
    at: float, placement: Mapping[str, int], cluster: str | None
) -> tuple[float, list[tuple[str, int]], str]:
    return (at, sorted(placement.items()), cluster or "")


def observe(facts: RunFacts | None, event: JobEvent, seq: int | None = None) -> RunFacts:
    """Fold one run-level event (one that carries a ``run_id``), with its
    stream sequence ``seq`` when known, into ``facts``.

    Raises ``ValueError`` for an event about another run or about no run at
    all; a cancel of the run's job is applied to each run with :func:`end_run`.
    """
    run_id = getattr(event, "run_id", None)
    if run_id is None or isinstance(event, JobAccepted | JobRejected):  # the latter two carry no run id
        raise ValueError(f"{type(event).__name__} names no run; it cannot be metered per run")
    if facts is None:
        facts = RunFacts(run_id=run_id, job_id=event.job_id, tenant=event.tenant)
    elif facts.run_id != run_id:
        raise ValueError(f"event for run {run_id!r} folded into run {facts.run_id!r}")
    replace = msgspec.structs.replace
    if isinstance(event, JobAdmitted):
        if facts.admitted_at is None or event.at < facts.admitted_at:
            return replace(facts, admitted_at=event.at, attempt=event.attempt)
        return facts
    if isinstance(event, JobPlaced):
        placement: dict[str, int] = {}
        for replica in event.replicas:
            placement[replica.role] = placement.get(replica.role, 0) + len(replica.gpus)
        new = _placement_key(event.at, placement, event.cluster)
        if facts.placed_at is None or new < _placement_key(facts.placed_at, facts.placement, facts.cluster):
            return replace(facts, placed_at=event.at, placement=placement, cluster=event.cluster)
        return facts
    if isinstance(event, RunStarted):
        started_at = _earliest(facts.started_at, event.at)
        return facts if started_at == facts.started_at else replace(facts, started_at=started_at)
    outcome = outcome_of(event)
    if outcome is None:  # pragma: no cover - every run-level event is handled above
        return facts
    return end_run(facts, event.at, outcome, seq)


def role_gpus(accepted: JobAccepted) -> dict[str, tuple[str, int]]:
    """Role name -> (GPU type, GPUs requested) from an accepted job's spec."""
    return {role.name: (role.gpu_type, role.gpus) for role in accepted.spec.roles}


def gpus_held(facts: RunFacts, roles: RoleGpus | None = None) -> dict[str, int]:
    """GPUs the run held, by GPU type.

    The placement says how many GPUs each role got; the spec says their type.
    Without a placement the run is taken to hold what its spec asked for.
    """
    roles = roles or {}
    by_type: dict[str, int] = {}
    counts = facts.placement or {name: gpus for name, (_, gpus) in roles.items()}
    for role, gpus in counts.items():
        gpu_type = roles[role][0] if role in roles else UNKNOWN_GPU_TYPE
        by_type[gpu_type] = by_type.get(gpu_type, 0) + gpus
    return {t: n for t, n in sorted(by_type.items()) if n}


def overlap(start: float | None, end: float | None, lo: float | None = None, hi: float | None = None) -> float:
    """Seconds of [start, end) inside [lo, hi); None bounds are open.  Never negative."""
    if start is None or end is None:
        return 0.0
    if lo is not None and lo > start:
        start = lo
    if hi is not None and hi < end:
        end = hi
    return end - start if end > start else 0.0


def meter(
    facts: RunFacts, *, roles: RoleGpus | None = None, checkpoints: Iterable[float] = (), now: float | None = None
) -> UsageInterval:
    """Meter one run: an ended run to its end, an open one up to ``now``.

    An open run without ``now`` is metered as zero so far.  Times that
    contradict each other (a clock ahead on one host) never produce negative
    usage: each interval is clipped at zero.
    """
    by_type = gpus_held(facts, roles)
    gpus = sum(by_type.values())
    end = facts.ended_at if facts.ended_at is not None else now
    gpu_seconds = gpus * overlap(facts.started_at, end)
    idle_until = end if facts.started_at is None else facts.started_at
    if end is not None and idle_until is not None and end < idle_until:
        idle_until = end
    idle_seconds = gpus * overlap(facts.placed_at, idle_until)
    lost_seconds = 0.0
    last_checkpoint = None
    if (
        facts.outcome is not None
        and facts.outcome.startswith(FAILED)
        and facts.outcome[len(FAILED) :] in INFRASTRUCTURE_FAILURES
        and facts.started_at is not None
        and facts.ended_at is not None
    ):
        inside = [c for c in checkpoints if facts.started_at <= c <= facts.ended_at]
        last_checkpoint = max(inside) if inside else None
        since = last_checkpoint if last_checkpoint is not None else facts.started_at
        lost_seconds = gpus * overlap(since, facts.ended_at)
    return UsageInterval(
        run_id=facts.run_id,
        job_id=facts.job_id,
        tenant=facts.tenant,
        gpus=gpus,
        gpus_by_type=by_type,
        placed_at=facts.placed_at,
        started_at=facts.started_at,
        ended_at=facts.ended_at,
        outcome=facts.outcome,
        metered_to=end,
        gpu_seconds=gpu_seconds,
        idle_seconds=idle_seconds,
        lost_seconds=lost_seconds,
        last_checkpoint_at=last_checkpoint,
    )


def fold_run(run_id: str, events: Iterable[JobEvent]) -> tuple[RunFacts | None, dict[str, tuple[str, int]]]:
    """Fold every event about ``run_id`` in ``events``.

    Job-wide events of the run's job are used too: ``JobAccepted`` gives the
    GPU type of each role and a ``JobCancelled`` without a run id ends the run
    if nothing ended it earlier.  Events about other runs are ignored.
    """
    events = list(events)
    facts: RunFacts | None = None
    for event in events:
        if getattr(event, "run_id", None) == run_id:
            facts = observe(facts, event)
    roles: dict[str, tuple[str, int]] = {}
    if facts is None:
        return None, roles
    accepted = [e for e in events if isinstance(e, JobAccepted) and e.job_id == facts.job_id]
    if accepted:
        roles = role_gpus(min(accepted, key=lambda e: (e.at, msgspec.json.encode(e.spec))))
    for event in events:
        if isinstance(event, JobCancelled) and event.run_id is None and event.job_id == facts.job_id:
            facts = end_run(facts, event.at, CANCELLED)
    return facts, roles


def meter_run(
    run_id: str, events: Iterable[JobEvent], *, checkpoints: Iterable[float] = (), now: float | None = None
) -> UsageInterval | None:
    """Fold and meter one run from a list of lifecycle events (any order,
    duplicates allowed).  None when no event names ``run_id``."""
    facts, roles = fold_run(run_id, events)
    if facts is None:
        return None
    return meter(facts, roles=roles, checkpoints=checkpoints, now=now)
