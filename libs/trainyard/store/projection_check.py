"""Does a projection hold what its marker claims?

The marker (``proj:<name>``: epoch and last applied sequence) moves in the
same script as the state it describes, so a Redis that replays its log whole,
or loads a snapshot, keeps the two together.  A Redis that replays only part
of its log (a transaction refused on replay, keys evicted or deleted by
hand) may keep the marker and lose state: readers would then be told the
projection is current while jobs are missing or stale.  A projector checks
on joining a projection, before trusting its marker:

1. the newest job events the marker claims (the last ``SAMPLE`` messages up
   to its sequence): a job they created, or a job the projection holds, must
   hold the sequence of that event or a later one (a job created before
   ``forgotten_before``, the cutoff of the last retention sweep, may have
   been forgotten: see :mod:`trainyard.store.retention`);
2. the job counts by status add up to the jobs index.

A projection that fails either is rebuilt from the stream (see
:meth:`trainyard.store.projector.Projector.join`).
"""

from __future__ import annotations

import asyncio

import msgspec
import nats.js.errors

from trainyard.bus import Bus
from trainyard.events import JobAccepted, JobRejected, decode_job_event, subject_disagrees
from trainyard.store.lua_args import job_event_args
from trainyard.store.store import Store

#: How many of the newest messages the marker claims are checked.
SAMPLE = 8
_CREATING = (JobAccepted, JobRejected)  # events that make a job (the fold writes its hash)


async def _message(bus: Bus, stream: str, seq: int) -> tuple[int, str, bytes] | None:
    try:
        msg = await bus.js.get_msg(stream, seq)
    except nats.js.errors.NotFoundError:
        return None  # deleted (limits, or never stored): nothing to check it against
    return seq, msg.subject or "", msg.data or b""


async def jobs_missing(bus: Bus, store: Store, last: int) -> str | None:
    """Why the JOBS projection does not hold what its marker (``last``)
    claims; None when it does (or nothing can be told)."""
    if last <= 0:
        return None
    seqs = range(last, max(0, last - SAMPLE), -1)
    forgotten_before = float(await store.redis.hget(store.key("proj", "jobs"), "forgotten_before") or 0)
    for found in await asyncio.gather(*(_message(bus, "JOBS", seq) for seq in seqs)):
        if found is None:
            continue
        seq, subject, data = found
        try:
            event = decode_job_event(data)
            if subject_disagrees(subject, event):
                continue
            job_event_args(seq, event, data, epoch="", after=0)
        except (msgspec.DecodeError, msgspec.ValidationError, TypeError, ValueError, RecursionError):
            continue  # as the projector: the fold only moved the sequence past it
        status, job_seq = await store.redis.hmget(store.key("job", event.job_id), ["status", "last_seq"])
        if status is None:
            if isinstance(event, _CREATING) and event.at >= forgotten_before:
                return f"job {event.job_id} (created at sequence {seq}) is missing"
            continue  # an event for a job that never existed changes nothing
        held = int(job_seq or 0)
        if held < seq:
            return f"job {event.job_id} holds sequence {held}, not the event at {seq}"
    pipe = store.redis.pipeline(transaction=False)
    pipe.hvals(store.key("counts"))
    pipe.zcard(store.key("jobs"))
    counts, indexed = await pipe.execute()
    counted = sum(int(n) for n in counts)
    if counted != indexed:
        return f"{counted} jobs counted by status, {indexed} in the jobs index"
    return None
