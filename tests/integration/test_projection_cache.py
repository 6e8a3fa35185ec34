"""A value read from a projection is kept while the projection stands still,
and read again once it moves or is rebuilt (health's node roster)."""

from __future__ import annotations

import asyncio

from trainyard.bus import Bus
from trainyard.domain import NodeInfo
from trainyard.events import NodeRegistered, subjects
from trainyard.store import Projector, Store, views
from trainyard.store.cache import ProjectionCache


async def project(bus: Bus, store: Store) -> None:
    """Run a NODES projector until it holds the whole stream, then stop it."""
    projector = Projector(bus, store, "NODES")
    stop = asyncio.Event()
    task = asyncio.create_task(projector.run(stop))
    await projector.wait_for((await bus.js.stream_info("NODES")).state.last_seq)
    stop.set()
    await task


async def register(bus: Bus, node_id: str, boot: str) -> None:
    node = NodeInfo(node_id=node_id, cluster="c1", gpu_type="H100", gpus=8)
    await bus.publish(
        subjects.node("c1", node_id), NodeRegistered(at=1.0, node=node, boot_id=boot), msg_id=f"reg-{node_id}-{boot}"
    )


async def test_the_roster_is_read_once_while_the_nodes_projection_stands_still(bus: Bus, store: Store) -> None:
    await register(bus, "n1", "b1")
    await register(bus, "n2", "b1")
    await project(bus, store)
    roster = ProjectionCache(store, "nodes", views.read_roster, views.Roster())

    first = await roster.get()
    assert [(n.node_id, n.state, n.boot_id) for n in first.nodes] == [("n1", "healthy", "b1"), ("n2", "healthy", "b1")]
    for _ in range(5):
        assert await roster.get() is first
    assert roster.reads == 1


async def test_the_roster_is_read_again_after_a_node_event_is_projected(bus: Bus, store: Store) -> None:
    await register(bus, "n1", "b1")
    await project(bus, store)
    roster = ProjectionCache(store, "nodes", views.read_roster, views.Roster())
    assert (await roster.get()).nodes[0].boot_id == "b1"

    await register(bus, "n1", "b2")  # the agent restarted
    await register(bus, "n3", "b1")
    await project(bus, store)

    after = await roster.get()
    assert [(n.node_id, n.boot_id) for n in after.nodes] == [("n1", "b2"), ("n3", "b1")]
    assert set(after.infos) == {"n1", "n3"} and after.states == {n.node_id: n.state for n in after.nodes}
    assert roster.reads == 2


async def test_the_roster_is_read_again_after_redis_lost_the_projection(bus: Bus, store: Store) -> None:
    await register(bus, "n1", "b1")
    await project(bus, store)
    roster = ProjectionCache(store, "nodes", views.read_roster, views.Roster())
    assert [n.node_id for n in (await roster.get()).nodes] == ["n1"]

    await store.flush()  # Redis wiped: nothing is projected until the rebuild
    assert (await roster.get()).nodes == ()

    await project(bus, store)  # rebuilt from the stream under a new epoch
    assert [n.node_id for n in (await roster.get()).nodes] == ["n1"]
    assert roster.reads == 3
