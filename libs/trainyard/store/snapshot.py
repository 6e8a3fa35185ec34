"""Compacted snapshots of the JOBS projection, so a rebuild needs only the
stream's recent messages.

The JOBS stream keeps its messages for ``JOBS_MAX_AGE_S``
(:mod:`trainyard.bus.streams`); finished jobs leave the projection after
their retention (:mod:`trainyard.store.retention`).  What a rebuild needs of
the older messages is the projection they folded into, so admission takes a
snapshot every ``TRAINYARD_JOBS_SNAPSHOT_INTERVAL_S`` (an hour):

- :data:`COPY` copies, in one script (so at one moment, between two folds),
  every key the JOBS fold writes (:data:`EXACT` and the families of
  :data:`FAMILIES`), ``proj:jobs`` included: the state through its
  ``last_seq``; the copy is read out a chunk at a time and deleted.  The
  snapshot is that state, packed with MessagePack, and ``last_seq``; it is
  kept in the ledger database
  (:class:`~trainyard.ledger.snapshots.SnapshotStore`), the newest only.
- A projector that finds no JOBS projection in Redis (wiped, restarted
  empty, flushed for a rebuild) first runs :data:`RESTORE` with the newest
  snapshot: in one script, and only while Redis still holds no projection
  (so two projectors joining at once restore it once), it writes every key
  back, under a new epoch, and the projector replays the stream from the
  sequence after the snapshot's.  The fold being deterministic, the result
  is what replaying the whole stream would give, less the jobs retention
  removed.

``gpumap`` is written by both folds (NODES sets each node's length, JOBS
marks GPUs held): it is restored node by node, the snapshot's marks over the
map the NODES projection may have rebuilt meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable

import msgspec
from redis.exceptions import RedisError
from sqlalchemy.exc import SQLAlchemyError

from trainyard.ledger.snapshots import Snapshot, SnapshotStore
from trainyard.settings import Settings
from trainyard.store.store import Store

log = logging.getLogger(__name__)

PROJECTION = "jobs"
#: The keys of the JOBS fold (lua/apply_job_event.lua) by name ...
EXACT = (
    "proj:jobs",
    "jobs",
    "counts",
    "finished",
    "pending",
    "pendingqueues",
    "admitted",
    "active",
    "inuse",
    "gpumap",
    "violations",
)
#: ... and by family (the name up to its first ':').
FAMILIES = ("job", "tenant", "bystatus", "tbystatus", "pendingq", "alloc", "noderuns")


def _lua_set(names: tuple[str, ...]) -> str:
    return "{" + ", ".join(f"[{n!r}] = true" for n in names) + "}"


#: KEYS[1] = the key prefix; ARGV[1] = the prefix of a copy, ARGV[2] its
#: time to live in seconds.  Copies every key of the JOBS fold under the copy's
#: prefix (its name after it), all at one moment; returns how many.
COPY = f"""
local p, copy, ttl = KEYS[1], ARGV[1], ARGV[2]
local exact, families = {_lua_set(EXACT)}, {_lua_set(FAMILIES)}
local copied, cursor = 0, '0'
repeat
  local r = redis.call('SCAN', cursor, 'MATCH', p .. '*', 'COUNT', 1000)
  cursor = r[1]
  for _, key in ipairs(r[2]) do
    local name = string.sub(key, #p + 1)
    local family = string.match(name, '^([^:]+):')
    if exact[name] or (family and families[family]) then
      redis.call('COPY', key, copy .. name, 'REPLACE')
      redis.call('EXPIRE', copy .. name, ttl)
      copied = copied + 1
    end
  end
until cursor == '0'
return copied
"""
#: A copy left behind by a snapshot that stopped half-way goes away by itself after this long.
COPY_TTL_S = 3600
_READ_CHUNK = 500  # keys of the copy read per round trip

#: KEYS[1] = the key prefix; ARGV[1] = a snapshot's packed keys, ARGV[2] = a
#: new epoch.  Writes the snapshot back unless Redis holds a JOBS projection
#: (returns 0 then, 1 when restored).
RESTORE = """
local p = KEYS[1]
if redis.call('EXISTS', p .. 'proj:jobs') == 1 then return 0 end
local function chunks(cmd, key, values, step, pairs_swapped)
  local args = {}
  for i = 1, #values, step do
    if pairs_swapped then
      args[#args + 1] = values[i + 1]
      args[#args + 1] = values[i]
    else
      for j = i, i + step - 1 do args[#args + 1] = values[j] end
    end
    if #args >= 512 then redis.call(cmd, key, unpack(args)); args = {} end
  end
  if #args > 0 then redis.call(cmd, key, unpack(args)) end
end
local proj
for _, e in ipairs(cmsgpack.unpack(ARGV[1])) do
  local name, t, v = e[1], e[2], e[3]
  local key = p .. name
  if name == 'proj:jobs' then
    proj = v
  elseif name == 'gpumap' then
    for i = 1, #v, 2 do
      local now = redis.call('HGET', key, v[i]) or ''
      redis.call('HSET', key, v[i], v[i + 1] .. string.sub(now, #v[i + 1] + 1))
    end
  else
    redis.call('DEL', key)
    if t == 'hash' then chunks('HSET', key, v, 2, false)
    elseif t == 'zset' then chunks('ZADD', key, v, 2, true)
    elseif t == 'set' then chunks('SADD', key, v, 1, false)
    elseif t == 'list' then chunks('RPUSH', key, v, 1, false)
    elseif t == 'string' then redis.call('SET', key, v[1]) end
  end
end
chunks('HSET', p .. 'proj:jobs', proj, 2, false)
redis.call('HSET', p .. 'proj:jobs', 'epoch', ARGV[2])
return 1
"""

_pack = msgspec.msgpack.encode


def snapshot_store(settings: Settings) -> SnapshotStore | None:
    """Where the JOBS snapshots are kept: the ledger database; None without one."""
    return SnapshotStore(settings.ledger_url) if settings.ledger_url else None


async def take(store: Store, clock: Callable[[], float] = time.time) -> Snapshot | None:
    """The JOBS projection as Redis holds it now; None when it holds none.

    One script copies every key of the JOBS fold at one moment, between two
    folds (``COPY`` inside Redis, far cheaper than reading them out), under a
    prefix of this snapshot's own; the copy, which nothing else writes, is
    then read a chunk at a time and deleted, so Redis is held only while it
    copies."""
    copy = store.key("snapshot", uuid.uuid4().hex) + ":"
    at = clock()
    await store.run_script(store.redis.register_script(COPY), [[copy, str(COPY_TTL_S)]])
    names = [key async for key in store.redis.scan_iter(match=copy + "*", count=1000)]
    try:
        keys: dict[str, tuple[str, list[str]]] = {}
        for start in range(0, len(names), _READ_CHUNK):
            keys.update(await _read(store, names[start : start + _READ_CHUNK], len(copy)))
    finally:
        for start in range(0, len(names), _READ_CHUNK):
            await store.redis.unlink(*names[start : start + _READ_CHUNK])
    proj = keys.get("proj:jobs")
    if proj is None:
        return None
    fields = dict(zip(proj[1][::2], proj[1][1::2], strict=True))
    if not fields.get("epoch"):
        return None
    packed = _pack([[name, kind, values] for name, (kind, values) in sorted(keys.items())])
    return Snapshot(int(fields.get("last_seq") or 0), at, packed)


#: KEYS = keys of a copy.  Returns {type, values} for each, as RESTORE takes
#: them (hash: field, value, ...; zset: member, score, ...; set and list:
#: members; string: {value}; a key gone: {'none', {}}).
_READ = """
local out = {}
for i, key in ipairs(KEYS) do
  local t = redis.call('TYPE', key)['ok']
  local v = {}
  if t == 'hash' then v = redis.call('HGETALL', key)
  elseif t == 'zset' then v = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
  elseif t == 'set' then v = redis.call('SMEMBERS', key)
  elseif t == 'list' then v = redis.call('LRANGE', key, 0, -1)
  elseif t == 'string' then v = {redis.call('GET', key)} end
  out[i] = {t, v}
end
return out
"""


async def _read(store: Store, names: list[str], cut: int) -> dict[str, tuple[str, list[str]]]:
    """Each key of ``names`` (copies: nothing writes them) by its name after
    ``cut`` characters: its type and its values as :data:`RESTORE` takes them."""
    (rows,) = await store.run_script(store.redis.register_script(_READ), [[]], keys=names)
    return {name[cut:]: (kind, values) for name, (kind, values) in zip(names, rows, strict=True) if kind != "none"}


async def restore(store: Store, snapshots: SnapshotStore, stream_last: int) -> int | None:
    """Write the newest snapshot back into a Redis that holds no JOBS
    projection; returns the sequence it holds through, or None when nothing
    was restored (Redis holds a projection, or there is no snapshot).  A
    snapshot past the stream's last sequence ``stream_last`` is of another
    stream (NATS started over with an empty one): it is not used."""
    if await store.redis.exists(store.key("proj", PROJECTION)):
        return None
    snapshot = await asyncio.to_thread(snapshots.get, PROJECTION)
    if snapshot is None:
        return None
    if snapshot.seq > stream_last:
        log.error(
            "the JOBS snapshot holds through sequence %d, past the stream's last (%d): another stream's, not used",
            snapshot.seq,
            stream_last,
        )
        return None
    script = store.redis.register_script(RESTORE)
    (restored,) = await store.run_script(script, [[snapshot.data, uuid.uuid4().hex]])
    if not restored:
        return None  # another projector started one meanwhile
    log.info("JOBS projection restored from its snapshot through sequence %d", snapshot.seq)
    return snapshot.seq


async def run_snapshotter(
    stop: asyncio.Event,
    store: Store,
    snapshots: SnapshotStore,
    interval_s: float,
    clock: Callable[[], float] = time.time,
) -> None:
    """Take a snapshot every ``interval_s`` until ``stop``; Redis or the
    database failing is logged and the next one tries again."""
    while True:
        try:
            await asyncio.wait_for(stop.wait(), interval_s)
            return
        except TimeoutError:
            pass
        try:
            snapshot = await take(store, clock)
            if snapshot is not None and await asyncio.to_thread(snapshots.put, PROJECTION, snapshot):
                log.debug("JOBS snapshot through sequence %d (%d bytes)", snapshot.seq, len(snapshot.data))
        except (RedisError, SQLAlchemyError, OSError) as err:
            log.warning("JOBS snapshot not taken (%r); trying again in %.0fs", err, interval_s)
