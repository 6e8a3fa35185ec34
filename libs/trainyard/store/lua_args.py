"""The Lua folds' arguments for one stream message (see lua/apply_job_event.lua
and lua/apply_node_event.lua), and the check that a job event's subject
agrees with its body."""

from __future__ import annotations

import json

import msgspec

from trainyard.core.lifecycle import HEAD_OF_QUEUE_OFFSET
from trainyard.events import (
    CheckpointSaved,
    JobAccepted,
    JobAdmitted,
    JobCancelled,
    JobPlaced,
    JobRejected,
    NodeLost,
    NodeRegistered,
    PreemptionNotice,
    RunFailed,
    RunStarted,
    RunSucceeded,
)
from trainyard.events.jobs import failure_category

_json = msgspec.json.Encoder()


class _Carried(msgspec.Struct):
    """A ``JobAccepted`` message's spec as it was carried: the JSON, not decoded."""

    spec: msgspec.Raw


_carried = msgspec.json.Decoder(_Carried)


def job_event_args(seq: int, event: object | None, data: bytes, *, epoch: str, after: int) -> list[str | bytes]:
    """The Lua arguments for one job event (see apply_job_event.lua, which
    applies the rules of :func:`trainyard.core.lifecycle.apply`), guarded by
    the projection's ``epoch`` and the sequence it must hold before this one
    (``after``).  ``data`` is the message ``event`` was decoded from: a job's
    spec is stored as the JSON it carried, not decoded and encoded again.
    ``event`` None: a message that cannot be read, which only moves the
    projection's sequence."""
    fields = [str(seq), ""] if event is None else _job_fields(seq, event, data)
    return [*fields, epoch, str(after)]


def _job_fields(seq: int, event: object, data: bytes) -> list[str | bytes]:
    head: list[str | bytes] = [str(seq), type(event).__name__]
    if isinstance(event, JobAccepted):
        spec = event.spec
        # Lua's cjson turns [] into {} and back; the spec stays opaque JSON text.
        return head + [
            event.job_id,
            repr(event.at),
            spec.tenant,
            spec.queue,
            str(seq),
            json.dumps(spec.gpus_by_type),
            bytes(_carried.decode(data).spec),
            repr(event.submitted_at),
            spec.priority_class,
            spec.name,
            str(spec.total_gpus),
            str(spec.max_retries),
        ]
    if isinstance(event, JobRejected):
        errors = _json.encode(event.errors).decode()
        return head + [event.job_id, repr(event.at), event.tenant, errors, str(seq)]
    if isinstance(event, JobAdmitted):
        return head + [event.job_id, repr(event.at), event.run_id, str(event.attempt)]
    if isinstance(event, JobPlaced):
        replicas = _json.encode(event.replicas).decode()
        return head + [event.job_id, repr(event.at), event.run_id, replicas, event.cluster]
    if isinstance(event, (RunStarted, RunSucceeded)):
        return head + [event.job_id, repr(event.at), event.run_id]
    if isinstance(event, RunFailed):
        category, (base, cap) = failure_category(event.reason)
        return head + [
            event.job_id,
            repr(event.at),
            event.run_id,
            event.reason,
            event.message,
            category,
            repr(base),
            repr(cap),
            str(HEAD_OF_QUEUE_OFFSET),
        ]
    if isinstance(event, PreemptionNotice):
        deadline = repr(event.at + event.grace_period_s)
        return head + [event.job_id, repr(event.at), event.run_id, deadline, event.preemptor, event.reason]
    if isinstance(event, CheckpointSaved):
        return head + [event.job_id, repr(event.at), event.run_id, str(event.step)]
    if isinstance(event, JobCancelled):
        return head + [event.job_id, repr(event.at), event.run_id or "", event.reason]
    raise TypeError(f"no projection for {type(event).__name__}")


def node_event_args(seq: int, event: object | None, *, epoch: str, after: int) -> list[str]:
    """The Lua arguments for one node event (see apply_node_event.lua), guarded
    as :func:`job_event_args` describes."""
    fields = [str(seq), ""] if event is None else _node_fields(seq, event)
    return [*fields, epoch, str(after)]


def _node_fields(seq: int, event: object) -> list[str]:
    from trainyard.events.nodes import NodeStateChanged

    head = [str(seq), type(event).__name__]
    if isinstance(event, NodeRegistered):
        node = event.node
        info = _json.encode(node).decode()
        return head + [node.node_id, repr(event.at), info, node.gpu_type, str(node.gpus), node.cluster, event.boot_id]
    if isinstance(event, NodeLost):
        return head + [event.node_id, repr(event.at), event.boot_id, event.reason]
    if isinstance(event, NodeStateChanged):
        return head + [event.node_id, repr(event.at), event.state, event.reason, event.by]
    return head + ["", repr(getattr(event, "at", 0.0))]  # other node events only move last_seq
