"""What the health service keeps in Redis, next to the projections.

- ``health:rec`` / ``health:ver``: node id -> ``NodeHealthRecord`` (JSON, with
  its bounded history) and its version; saved with a version check so two
  health processes never overwrite each other's decisions.
- ``health:sample``: node id -> the last GPU sample (rates compare two samples).
- ``health:recent``: recent suspect and fatal findings, scored by time, for
  rack correlation across the fleet.
- ``health:checks``: node id -> why health checks are wanted (retried until an
  agent answers).
- ``health:hb``: ``<node id>/<boot id>`` -> the newest heartbeat read from that
  boot, in stream time (when JetStream stored it); only ever moves forward.

Records are read through :class:`trainyard.store.node_records.NodeRecords`,
by health and by the gateway (``GET /v1/nodes/{id}/history``).
"""

from __future__ import annotations

import msgspec

from trainyard.core.health import Finding, NodeHealthRecord
from trainyard.domain.node import NodeState
from trainyard.gpu.nvml import NodeSample
from trainyard.store import Store
from trainyard.store.node_records import NodeRecords

_sample = msgspec.json.Decoder(NodeSample)
_finding = msgspec.json.Decoder(Finding)
_json = msgspec.json.Encoder()

_SAVE = """
local current = redis.call('HGET', KEYS[2], ARGV[1]) or '0'
if current ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[4])
return 1
"""

#: A batch of heartbeats in one call: KEYS = (health:hb, nodestate); ARGV[1] =
#: the node hash prefix, then (node id, boot id, stream time) per heartbeat,
#: applied in order.  Per heartbeat: 1 if it moved its boot's time forward, the
#: node's registered boot, its projected state (nil when absent).
_HEARTBEATS = """
local out = {}
for i = 2, #ARGV, 3 do
  local node, boot, at = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  out[#out + 1] = redis.call('ZADD', KEYS[1], 'GT', 'CH', at, node .. '/' .. boot)
  out[#out + 1] = redis.call('HGET', ARGV[1] .. node, 'boot_id')
  out[#out + 1] = redis.call('HGET', KEYS[2], node)
end
return out
"""


class HeartbeatRead(msgspec.Struct, frozen=True):
    """One heartbeat as stored, with what the projection says of its node."""

    node_id: str
    boot_id: str
    advanced: bool  # newer than any heartbeat read before from this boot
    registered_boot: str | None  # the boot the node is registered with
    state: str | None  # the node's projected state


class VersionConflict(Exception):
    """Another health process changed the record first."""


class RecordStore:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.redis = store.redis
        self.records = NodeRecords(store)
        self._save = store.redis.register_script(_SAVE)
        self._heartbeats = store.redis.register_script(_HEARTBEATS)

    def _k(self, name: str) -> str:
        return self.store.key("health", name)

    async def load_all(self, projection_states: dict[str, str] | None = None) -> dict[str, NodeHealthRecord]:
        """Every known node's record; a node without one starts from its projected state."""
        records = await self.records.all()
        for node_id, state in (projection_states or {}).items():
            if node_id not in records:
                records[node_id] = fresh(node_id, state)
        return records

    async def load(self, node_id: str, projected_state: str | None = None) -> NodeHealthRecord:
        record = await self.records.get(node_id)
        return record if record is not None else fresh(node_id, projected_state)

    async def save(self, before: NodeHealthRecord, after: NodeHealthRecord) -> None:
        if after is before or after == before:
            return
        expected = str(before.version)  # a node without a record is at version 0
        ok = await self._save(
            keys=[self._k("rec"), self._k("ver")],
            args=[after.node_id, expected, _json.encode(after).decode(), str(after.version)],
        )
        if not ok:
            raise VersionConflict(after.node_id)

    async def previous_sample(self, node_id: str) -> NodeSample | None:
        data = await self.redis.hget(self._k("sample"), node_id)
        return _sample.decode(data) if data else None

    async def keep_sample(self, sample: NodeSample) -> None:
        await self.redis.hset(self._k("sample"), sample.node_id, _json.encode(sample))

    async def recent_findings(self, new: list[Finding], now: float, window_s: float) -> list[Finding]:
        """Add ``new`` to the recent findings and return every one within the window."""
        key = self._k("recent")
        pipe = self.redis.pipeline(transaction=False)
        for f in new:
            pipe.zadd(key, {_json.encode(f).decode(): f.at})
        pipe.zremrangebyscore(key, "-inf", now - window_s)
        pipe.zrangebyscore(key, now - window_s, "+inf")
        results = await pipe.execute()
        return [_finding.decode(item) for item in results[-1]]

    async def once(self, name: str, ttl_s: float) -> bool:
        """True the first time ``name`` is seen within ``ttl_s`` (alert deduplication)."""
        return bool(await self.redis.set(self._k("once:" + name), "1", nx=True, px=max(1, int(ttl_s * 1000))))

    # --- heartbeats ---

    async def record_heartbeats(self, beats: list[tuple[str, str, float]]) -> list[HeartbeatRead]:
        """Store ``(node id, boot id, stream time)`` heartbeats; each moves its boot's time forward only."""
        if not beats:
            return []
        args: list[str] = [self.store.key("node", "")]
        for node_id, boot_id, at in beats:
            args += (node_id, boot_id, repr(at))
        results = await self._heartbeats(keys=[self._k("hb"), self.store.key("nodestate")], args=args)
        return [
            HeartbeatRead(node_id, boot_id, bool(results[3 * i]), results[3 * i + 1], results[3 * i + 2])
            for i, (node_id, boot_id, _) in enumerate(beats)
        ]

    async def heartbeats(self) -> dict[tuple[str, str], float]:
        """(node id, boot id) -> the newest heartbeat read from that boot."""
        rows = await self.redis.zrange(self._k("hb"), 0, -1, withscores=True)
        out = {}
        for member, at in rows:
            node_id, _, boot_id = member.rpartition("/")
            out[(node_id, boot_id)] = at
        return out

    async def forget_heartbeats(self, keys: list[tuple[str, str]]) -> None:
        """Drop the heartbeats of boots a node no longer runs."""
        if keys:
            await self.redis.zrem(self._k("hb"), *[f"{n}/{b}" for n, b in keys])

    async def want_checks(self, node_id: str, reason: str) -> None:
        await self.redis.hset(self._k("checks"), node_id, reason)

    async def wanted_checks(self) -> dict[str, str]:
        return await self.redis.hgetall(self._k("checks"))

    async def checks_done(self, node_id: str) -> None:
        await self.redis.hdel(self._k("checks"), node_id)


def fresh(node_id: str, projected_state: str | None = None) -> NodeHealthRecord:
    """The record of a node health has not judged yet.  It starts from the
    projected state, except ``lost``: the projection may show a ``NodeLost``
    health is about to apply to the record itself."""
    try:
        state = NodeState(projected_state) if projected_state else NodeState.HEALTHY
    except ValueError:  # "registering", "unknown"
        state = NodeState.HEALTHY
    if state == NodeState.LOST:
        state = NodeState.HEALTHY
    return NodeHealthRecord(node_id=node_id, state=state)
