"""Retention of the JOBS projection: a finished job leaves Redis once its
retention has passed, after its record is written to the job archive.

The fold keeps every finished job in the index ``finished``, scored by when
it finished (``lua/apply_job_event.lua``).  A sweep reads the jobs that
finished before ``now - retention`` in batches of ``batch``; for each batch it

1. writes their records to the archive (:class:`~trainyard.ledger.archive.JobArchive`,
   one transaction; writing a job again changes nothing), then
2. runs :data:`FORGET`, one script per batch, which removes each job whose
   hash still holds the ``last_seq`` that was archived: the hash
   ``job:<id>``, its entries in ``jobs``, ``tenant:<t>``, ``bystatus:<s>``,
   ``tbystatus:<t>:<s>`` and ``finished``, its count in ``counts`` and any
   waiting reason (``why:*``).  A finished job holds nothing else: its run's
   GPUs, allocations and pending or active entries were given back when it
   finished.

A sweep that stops anywhere (a crash, Redis or the database down) leaves
each job either still in Redis or archived, never neither: step 2 runs only
after step 1 is stored, and each batch's removal is one atomic script.  The
next sweep archives again what was archived already and removes what is
left.  A job whose hash moved on since it was archived (a late event only
moves its ``last_seq``) stays for the next sweep.

The script also raises ``forgotten_before`` in ``proj:jobs`` to the cutoff,
so the check a projector runs on joining (:mod:`~trainyard.store.projection_check`)
does not take a job created before it and missing for a lost projection.

Projections folded before the ``finished`` index existed are indexed by
:func:`backfill` (run once when a sweeper starts): the jobs of each finished
status, a page at a time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import cast

from redis.exceptions import RedisError
from sqlalchemy.exc import SQLAlchemyError

from trainyard.core.lifecycle import TERMINAL
from trainyard.ledger.archive import JobArchive
from trainyard.store import views
from trainyard.store.store import Store

log = logging.getLogger(__name__)

#: Jobs forgotten per script call (and archived per transaction).
BATCH = 500

_TERMINAL_LUA = "{" + ", ".join(f"{s} = true" for s in sorted(TERMINAL)) + "}"

#: KEYS[1] = the key prefix; ARGV[1] = the cutoff (seconds since the epoch),
#: then pairs of job id and the last_seq its archived record holds.  Removes
#: each finished job that finished at or before the cutoff and still holds
#: that last_seq; returns how many it removed.
FORGET = f"""
local p = KEYS[1]
local cutoff = tonumber(ARGV[1])
local terminal = {_TERMINAL_LUA}
local forgotten = 0
for i = 2, #ARGV, 2 do
  local jid, archived = ARGV[i], ARGV[i + 1]
  local jk = p .. 'job:' .. jid
  local h = redis.call('HMGET', jk, 'status', 'tenant', 'finished_at', 'last_seq')
  local status, tenant, finished = h[1], h[2] or '', tonumber(h[3] or '')
  if not status or not terminal[status] then
    redis.call('ZREM', p .. 'finished', jid)  -- gone already, or not finished: nothing to forget
  elseif finished and finished > cutoff then
    redis.call('ZADD', p .. 'finished', finished, jid)  -- indexed under another time: put it right
  elseif h[4] == archived then
    redis.call('HINCRBY', p .. 'counts', status, -1)
    redis.call('ZREM', p .. 'jobs', jid)
    redis.call('ZREM', p .. 'tenant:' .. tenant, jid)
    redis.call('ZREM', p .. 'bystatus:' .. status, jid)
    redis.call('ZREM', p .. 'tbystatus:' .. tenant .. ':' .. status, jid)
    redis.call('ZREM', p .. 'finished', jid)
    redis.call('HDEL', p .. 'why:pending', jid)
    redis.call('HDEL', p .. 'why:admitted', jid)
    redis.call('DEL', jk)
    forgotten = forgotten + 1
  end
end
if forgotten > 0 then
  local before = tonumber(redis.call('HGET', p .. 'proj:jobs', 'forgotten_before') or '0')
  if cutoff > before then redis.call('HSET', p .. 'proj:jobs', 'forgotten_before', ARGV[1]) end
end
return forgotten
"""

#: KEYS[1] = the key prefix; ARGV = job ids.  Adds each finished job that is
#: not in the index ``finished`` to it, scored by its finished_at.
_BACKFILL = f"""
local p = KEYS[1]
local terminal = {_TERMINAL_LUA}
local added = 0
for _, jid in ipairs(ARGV) do
  local h = redis.call('HMGET', p .. 'job:' .. jid, 'status', 'finished_at')
  if h[1] and terminal[h[1]] and h[2] then
    added = added + redis.call('ZADD', p .. 'finished', 'NX', h[2], jid)
  end
end
return added
"""

_PAGE = 2000  # jobs of a status index read per backfill step


async def backfill(store: Store) -> int:
    """Index the finished jobs the ``finished`` index lacks (a projection
    folded before it existed); returns how many were added.  Does nothing
    when the index already holds as many jobs as the finished counts say."""
    counts = await views.status_counts(store)
    finished = sum(counts.get(s, 0) for s in TERMINAL)
    if await store.redis.zcard(store.key("finished")) >= finished:
        return 0
    script = store.redis.register_script(_BACKFILL)
    added = 0
    for status in sorted(TERMINAL):
        start = 0
        while ids := cast(list[str], await store.redis.zrange(store.key("bystatus", status), start, start + _PAGE - 1)):
            (n,) = await store.run_script(script, [ids])
            added += int(n)
            start += _PAGE
    return added


async def sweep(store: Store, archive: JobArchive, cutoff: float, batch: int = BATCH) -> int:
    """Archive and forget every job that finished at or before ``cutoff``;
    returns how many left the projection."""
    if batch < 1:
        raise ValueError(f"batch must be at least 1, got {batch}")
    script = store.redis.register_script(FORGET)
    total = 0
    while True:
        ids = cast(
            list[str], await store.redis.zrangebyscore(store.key("finished"), "-inf", repr(cutoff), start=0, num=batch)
        )
        if not ids:
            return total
        records = [r for r in await views.get_jobs(store, ids) if r.status in TERMINAL]
        scores = await store.redis.zmscore(store.key("jobs"), ids)  # where lists place each job
        places = {job_id: int(score) for job_id, score in zip(ids, scores, strict=True) if score is not None}
        await asyncio.to_thread(archive.put, records, places)
        archived = {r.job_id: str(r.last_seq) for r in records}
        args: list[str] = [repr(cutoff)]
        for job_id in ids:
            args += (job_id, archived.get(job_id, ""))
        (forgotten,) = await store.run_script(script, [args])
        total += int(forgotten)
        if len(ids) < batch or not forgotten:
            return total  # the last batch, or one whose jobs moved on meanwhile: the next sweep takes them


async def run_sweeper(
    stop: asyncio.Event,
    store: Store,
    archive: JobArchive,
    retention_s: float,
    interval_s: float,
    clock: Callable[[], float] = time.time,
) -> None:
    """Sweep every ``interval_s`` until ``stop``, forgetting jobs finished
    more than ``retention_s`` ago.  Redis or the database failing is logged
    and the next sweep tries again."""
    indexed = False
    while not stop.is_set():
        try:
            if not indexed:
                await asyncio.to_thread(archive.create_schema)
                if added := await backfill(store):
                    log.info("retention: indexed %d finished jobs by when they finished", added)
                indexed = True
            forgotten = await sweep(store, archive, clock() - retention_s)
            if forgotten:
                log.info("retention: %d finished jobs archived and removed from the projection", forgotten)
        except (RedisError, SQLAlchemyError, OSError) as err:
            log.warning("retention sweep failed (%r); trying again in %.0fs", err, interval_s)
        try:
            await asyncio.wait_for(stop.wait(), interval_s)
        except TimeoutError:
            pass
