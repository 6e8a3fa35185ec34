"""Health records a batch of heartbeats in one Redis script call; against a
real Redis it leaves the same state, and reads the same, as one call per
heartbeat in order, stale and duplicate heartbeats included."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from trainyard.local.servers import Server
from trainyard.store import Store
from trainyard_health.records import HeartbeatRead, RecordStore

BATCHES = [
    [("n1", "b1", 100.0), ("n2", "b2", 100.5), ("n1", "b1", 101.0)],
    [
        ("n1", "b1", 100.0),  # stale: older than the one recorded
        ("n1", "b1", 101.0),  # duplicate of the one recorded
        ("n2", "b2", 102.25),
        ("n1", "b0", 99.0),  # an old boot of n1
        ("n3", "b3", 103.0),  # a node with no registration and no state
        ("n2", "b2", 102.0),  # stale within the same batch
        ("n4", "b4", 1.5e9 + 0.123456),  # a real timestamp keeps its precision
    ],
]


async def one_per_heartbeat(store: Store, beats: list[tuple[str, str, float]]) -> list[HeartbeatRead]:
    out = []
    for node_id, boot_id, at in beats:
        advanced = await store.redis.zadd(store.key("health", "hb"), {f"{node_id}/{boot_id}": at}, gt=True, ch=True)
        boot = await store.redis.hget(store.key("node", node_id), "boot_id")
        state = await store.redis.hget(store.key("nodestate"), node_id)
        out.append(HeartbeatRead(node_id, boot_id, bool(advanced), boot, state))
    return out


async def seed(store: Store) -> None:
    await store.redis.hset(store.key("node", "n1"), "boot_id", "b1")
    await store.redis.hset(store.key("node", "n2"), "boot_id", "b2")
    await store.redis.hset(store.key("node", "n4"), "boot_id", "b4")
    await store.redis.hset(store.key("nodestate"), mapping={"n1": "healthy", "n2": "lost"})


@pytest.fixture
async def reference(redis_server: Server) -> AsyncIterator[Store]:
    s = Store.from_url(redis_server.url, f"t{uuid.uuid4().hex[:10]}:")
    yield s
    await s.flush()
    await s.close()


@pytest.mark.parametrize(
    "split", [pytest.param(False, id="batches as sent"), pytest.param(True, id="all in one batch")]
)
async def test_a_batch_in_one_script_call_matches_one_call_per_heartbeat(
    store: Store, reference: Store, split: bool
) -> None:
    await seed(store)
    await seed(reference)
    records = RecordStore(store)
    batches = BATCHES if not split else [[b for batch in BATCHES for b in batch]]
    for batch in batches:
        assert await records.record_heartbeats(batch) == await one_per_heartbeat(reference, batch)
    assert await records.heartbeats() == await RecordStore(reference).heartbeats()
    assert await records.heartbeats() == {
        ("n1", "b1"): 101.0,
        ("n2", "b2"): 102.25,
        ("n1", "b0"): 99.0,
        ("n3", "b3"): 103.0,
        ("n4", "b4"): 1.5e9 + 0.123456,
    }


async def test_an_empty_batch_touches_nothing(store: Store) -> None:
    assert await RecordStore(store).record_heartbeats([]) == []
    assert await RecordStore(store).heartbeats() == {}
