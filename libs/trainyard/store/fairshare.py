"""Fair-share standing in Redis, derived from the JOBS stream alone.

``fairshare`` (a hash) holds ``seq``, the last JOBS sequence folded, and
``state``, the :class:`~trainyard.core.admission.usage_fold.UsageFold` as
JSON (keys sorted).  :class:`FairShareLog` folds the stream from ``seq + 1``
to its head and saves, fenced by ``seq`` so two writers never interleave;
a Redis that lost the hash (wiped, flushed, restarted empty) or a state
folded with another half-life is folded again from the stream start.  Since
only event times enter the fold, the rebuilt hash is byte for byte the one
the live fold had written through the same sequence.

:class:`FairShareStandings` is the one way to read it (admission's cycle,
the console's tenancy page).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import msgspec
import nats.errors
from nats.js.api import ConsumerConfig, DeliverPolicy

from trainyard.bus import Bus
from trainyard.core.admission.usage_fold import Table, UsageFold
from trainyard.events import (
    JobAdmitted,
    JobCancelled,
    PreemptionNotice,
    RunFailed,
    RunSucceeded,
    decode_job_event,
    subject_disagrees,
    subjects,
)
from trainyard.store.store import Store

KEY = "fairshare"

#: Save the state only if ``seq`` is still what the fold started from.
_SAVE = """
local current = redis.call('HGET', KEYS[1], 'seq') or '0'
if current ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'seq', ARGV[2], 'state', ARGV[3])
return 1
"""


class Standings(msgspec.Struct, frozen=True):
    """Fair-share standing at one instant."""

    seq: int  # the last JOBS sequence folded
    usage: Table  # queue key -> GPU type -> decayed GPU-seconds
    preemptions: list[float]  # fair-share preemption times within the window asked for


def _encode(fold: UsageFold) -> str:
    return json.dumps(fold.to_dict(), sort_keys=True, separators=(",", ":"))


def apply(fold: UsageFold, data: bytes, subject: str) -> None:
    """Fold one JOBS message; anything else on the stream leaves the state as it was."""
    try:
        event = decode_job_event(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return  # the projection skips it too
    if subject_disagrees(subject, event):
        return
    if isinstance(event, JobAdmitted):
        if event.queue:
            fold.admitted(event.job_id, event.run_id, f"{event.tenant}/{event.queue}", event.gpus_by_type, event.at)
    elif isinstance(event, RunSucceeded | RunFailed | JobCancelled):
        fold.ended(event.job_id, event.run_id, event.at)
    elif isinstance(event, PreemptionNotice) and event.reason == "fair_share":
        fold.preempted(event.at)


async def _read(store: Store) -> tuple[int, UsageFold | None]:
    seq, raw = await store.redis.hmget(store.key(KEY), ["seq", "state"])
    if not raw:
        return int(seq or 0), None
    return int(seq or 0), UsageFold.from_dict(json.loads(raw))


class FairShareLog:
    """Folds the JOBS stream into ``fairshare`` (admission runs it before each cycle)."""

    def __init__(self, bus: Bus, store: Store, timeout_s: float = 30.0) -> None:
        self.bus = bus
        self.store = store
        self.timeout_s = timeout_s
        self._save = store.redis.register_script(_SAVE)

    async def catch_up(self, half_life: float) -> int:
        """Fold every message the stream holds now; returns the sequence folded through."""
        for _ in range(5):
            seq, fold = await _read(self.store)
            start = seq
            if fold is None or fold.half_life != half_life:
                start, fold = 0, UsageFold(half_life)
            head = (await self.bus.js.stream_info("JOBS")).state.last_seq
            if head <= start and start == seq:
                return seq
            through = await self._fold(fold, start, head)
            ok = await self._save(keys=[self.store.key(KEY)], args=[str(seq), str(through), _encode(fold)])
            if ok:
                return through
        raise RuntimeError("fair-share state changed under five folds in a row: is a second admission leading?")

    async def _fold(self, fold: UsageFold, after: int, head: int) -> int:
        """Fold the messages after ``after`` through ``head``; returns the last sequence read."""
        if head <= after:
            return after
        config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=after + 1)
        sub = await self.bus.js.subscribe(subjects.JOBS_ALL, stream="JOBS", ordered_consumer=True, config=config)
        last = after
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        try:
            while last < head:
                try:
                    msg: Any = await sub.next_msg(timeout=max(0.01, deadline - loop.time()))
                except (TimeoutError, nats.errors.TimeoutError) as err:
                    raise TimeoutError(f"JOBS stream read stopped at {last} of {head}") from err
                meta = msg.metadata
                seq = meta.sequence.stream
                if seq > head:
                    break
                apply(fold, msg.data, msg.subject)
                last = seq
                if meta.num_pending == 0:
                    break
        finally:
            await sub.unsubscribe()
        return max(last, head)


class FairShareStandings:
    """Reads the fair-share standing ``fairshare`` holds."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def raw(self) -> dict[str, str]:
        """The hash as stored (to compare a rebuild with)."""
        return await self.store.redis.hgetall(self.store.key(KEY))

    async def read(self, now: float, window_s: float = 600.0) -> Standings:
        """The decayed usage at ``now`` and the fair-share preemptions since ``now - window_s``;
        nothing folded yet reads as no usage."""
        seq, fold = await _read(self.store)
        if fold is None:
            return Standings(seq, {}, [])
        return Standings(seq, fold.usage(now), fold.recent_preemptions(now, window_s))
