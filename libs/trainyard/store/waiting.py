"""Why a job waits: what admission and placement say about the jobs they
leave waiting, kept beside the job projection, never in it.

The job hash belongs to the lifecycle fold.  Each decider keeps its word about
waiting jobs in a hash of its own, keyed by job id, named after the status it
explains:

- ``why:pending`` — admission: why a pending job is not admitted, and its
  place in line (``position``);
- ``why:admitted`` — placement: why an admitted gang is not placed yet, and
  when a reservation holds room for it (``expected_start``).

A reason holds only while the job keeps the status it was written for: the
fold drops a job's entries whenever its status changes (in the same script,
so no reader sees a stale one), and readers take the entry of the job's
current status only.  Each decider rewrites what changed every cycle and
removes the entries of jobs it no longer leaves waiting.  Nothing here is
derived from a stream: after a Redis wipe the next cycles write it again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from itertools import zip_longest

import msgspec

from trainyard.core.lifecycle import ADMITTED, PENDING, JobRecord
from trainyard.store.store import Store

#: The statuses a job waits in, each explained by one decider.
WAITING = (PENDING, ADMITTED)


class Waiting(msgspec.Struct, frozen=True, omit_defaults=True):
    """Why a job waits, as its decider last said."""

    reason: str  # a PendingReason (admission) or placement's UnplacedReason, by value
    position: int | None = None  # admission: its 1-based place in its queue
    expected_start: float | None = None  # placement: when its reservation begins (seconds since the epoch)


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(Waiting).decode
_pack = msgspec.msgpack.encode


def key(store: Store, status: str) -> str:
    if status not in WAITING:
        raise ValueError(f"no job waits in status {status!r}")
    return store.key("why", status)


#: Sets many fields of one hash (KEYS[1]) from one MessagePack array of
#: ``[field, value, field, value, ...]`` (ARGV[1]), a few hundred per HSET, then
#: deletes the fields of the MessagePack array ARGV[2].  Running it again
#: changes nothing more.
_HSET_PACKED = """
local m = cmsgpack.unpack(ARGV[1])
for i = 1, #m, 512 do
  redis.call('HSET', KEYS[1], unpack(m, i, math.min(i + 511, #m)))
end
local g = cmsgpack.unpack(ARGV[2])
for i = 1, #g, 512 do
  redis.call('HDEL', KEYS[1], unpack(g, i, math.min(i + 511, #g)))
end
return #m / 2
"""
_CHUNK = 8192  # reasons (or forgotten jobs) per script call: bounds one call's time in the server


async def write(store: Store, status: str, why: Mapping[str, Waiting], gone: Iterable[str] = ()) -> None:
    """Record why each job of ``why`` waits in ``status``, and forget the
    jobs of ``gone`` (no longer left waiting by this decider).

    The reasons go :data:`_CHUNK` to a script call, each chunk packed by
    msgspec as one argument: the client packs one argument per chunk, not
    two per job (which made writing 100,000 reasons most of a cycle)."""
    gone = list(gone)
    if not why and not gone:
        return
    flat: list[str] = []
    for job_id, w in why.items():
        flat += (job_id, _encode(w).decode())
    sets = [flat[i : i + 2 * _CHUNK] for i in range(0, len(flat), 2 * _CHUNK)]
    drops = [gone[i : i + _CHUNK] for i in range(0, len(gone), _CHUNK)]
    calls = [(_pack(s), _pack(d)) for s, d in zip_longest(sets, drops, fillvalue=[])]
    await store.run_script(store.redis.register_script(_HSET_PACKED), calls, keys=[key(store, status)])


async def read(store: Store, jobs: Iterable[JobRecord]) -> dict[str, Waiting]:
    """Why each of ``jobs`` that waits does, as the decider of its current
    status said (a job not yet considered has no entry)."""
    by_status: dict[str, list[str]] = {}
    for job in jobs:
        if job.status in WAITING:
            by_status.setdefault(job.status, []).append(job.job_id)
    if not by_status:
        return {}
    pipe = store.redis.pipeline(transaction=False)
    for status, job_ids in by_status.items():
        pipe.hmget(key(store, status), job_ids)
    out = {}
    for job_ids, raws in zip(by_status.values(), await pipe.execute(), strict=True):
        out.update({j: _decode(raw) for j, raw in zip(job_ids, raws, strict=True) if raw})
    return out
