"""A 3-node NATS cluster with R3 streams: killing any one node, the stream
leader included, loses no acknowledged event; publishing and consuming carry
on; the node comes back and catches up."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import nats.errors
import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from trainyard.bus import Bus, ensure_streams
from trainyard.bus.streams import wait_for_leaders
from trainyard.events import JobCancelled
from trainyard.local.credentials import ADMIN, new_credentials, write_server_files
from trainyard.local.servers import NatsCluster, start_nats_cluster
from trainyard.local.supervisor import restart_server
from trainyard.testing.publish import publish_event
from trainyard.testing.waiting import eventually

T = TypeVar("T")


class Publisher:
    """Publishes job events one after another, as a service does: a publish
    that fails (no leader for a moment) is repeated with the same message id
    until it is acknowledged."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.acked: dict[str, int] = {}  # message id -> stream sequence
        self.failures = 0
        self.stop = asyncio.Event()

    async def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            msg_id = f"cancel:job-{n}"
            event = JobCancelled(at=float(n), job_id=f"job-{n}", tenant="acme")
            try:
                ack = await asyncio.wait_for(publish_event(self.bus, event, msg_id), 3.0)
            except (TimeoutError, nats.errors.Error):
                self.failures += 1
                continue  # the same message id again: deduplicated if it was stored after all
            self.acked[msg_id] = ack.seq
            n += 1


class Reader:
    """A durable pull consumer on JOBS that acks what it reads."""

    # A message delivered while its node is killed never reaches us and is sent again only once its ack
    # wait expires: 5 s rather than the default 30 s, so redelivery comes well within the test's wait.
    CONFIG = ConsumerConfig(durable_name="reader", ack_policy=AckPolicy.EXPLICIT, ack_wait=5.0)

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.seen: set[str] = set()
        self.errors: list[str] = []  # fetches that failed other than by timing out, for the failure message
        self.stop = asyncio.Event()

    async def create(self) -> None:
        """Create the consumer, asked again until the cluster answers.  Done before anything is published or
        killed: creating it beside the publisher raced the kills, and a create answered by a cluster between
        meta leaders fails with 503 "JetStream system temporarily unavailable" (not a timeout), which killed
        the reader, so the consumer read nothing more.  Asking again with the same config is idempotent."""
        await answered(lambda: self.bus.js.add_consumer("JOBS", self.CONFIG), "the reader's consumer created")

    async def run(self) -> None:
        sub = await self.bus.js.pull_subscribe_bind("reader", "JOBS")
        while not self.stop.is_set():
            try:
                batch = await sub.fetch(100, timeout=1.0)
            except TimeoutError:
                continue
            except nats.errors.Error as err:
                self.errors.append(repr(err))
                continue
            for msg in batch:
                self.seen.add(msg.headers["Nats-Msg-Id"])
                with contextlib.suppress(nats.errors.Error):
                    await msg.ack()


async def reader_state(reader: Reader, task: asyncio.Task[None], publisher: Publisher) -> str:
    """What the reader missed and where its consumer stands: the failure message of a read that never completed."""
    missing = sorted(set(publisher.acked) - reader.seen, key=lambda m: int(m.rsplit("-", 1)[1]))
    died = repr(task.exception()) if task.done() and not task.cancelled() else "no"
    try:
        consumer = repr(await reader.bus.js.consumer_info("JOBS", "reader"))
    except (TimeoutError, nats.errors.Error) as err:
        consumer = f"not answered: {err!r}"
    return (
        f"the consumer did not read {len(missing)} acknowledged events (first: {missing[:10]}, stream sequences "
        f"{[publisher.acked[m] for m in missing[:10]]}); reader task died: {died}; last fetch errors: "
        f"{reader.errors[-5:]}; consumer: {consumer}"
    )


async def leader(bus: Bus, stream: str = "JOBS") -> str:
    async def elected() -> str | None:
        try:
            info = await bus.js.stream_info(stream)
        except (TimeoutError, nats.errors.Error):
            return None
        return info.cluster.leader if info.cluster else None

    return await eventually(elected, timeout=30, what=f"{stream} has a leader")


async def all_current(bus: Bus, stream: str = "JOBS", consumer: str | None = None) -> bool:
    """Whether both followers of the stream (or of its ``consumer``) are current, neither offline nor behind."""
    try:
        info = await (bus.js.consumer_info(stream, consumer) if consumer else bus.js.stream_info(stream))
    except (TimeoutError, nats.errors.Error):
        return False
    peers = info.cluster.replicas or [] if info.cluster else []
    return len(peers) == 2 and all(p.current and not p.offline and not p.lag for p in peers)


async def answered(call: Callable[[], Awaitable[T]], what: str) -> T:
    """``call()``'s answer, asked again while JetStream is electing a leader (503, timeouts)."""

    async def attempt() -> tuple[T] | None:
        try:
            return (await call(),)
        except (TimeoutError, nats.errors.Error):
            return None

    return (await eventually(attempt, timeout=30, what=what))[0]


async def more_acked(publisher: Publisher, than: int) -> bool:
    return len(publisher.acked) >= than


async def test_killing_any_node_loses_nothing_acknowledged_and_the_node_catches_up(tmp_path: Path) -> None:
    credentials = new_credentials()
    (tmp_path / "bus").mkdir()
    nats_conf, _ = write_server_files(tmp_path / "bus", credentials)
    admin = credentials.nats_user(ADMIN)
    cluster = start_nats_cluster(
        tmp_path / "nats", 3, config_file=nats_conf, admin=(admin.name, admin.password), sync_interval="always"
    )
    bus = await Bus.connect(cluster.admin_url, "cluster-test")
    publisher, reader = Publisher(bus), Reader(bus)
    tasks: list[asyncio.Task[None]] = []
    try:
        await answered(lambda: ensure_streams(bus.js, replicas=3), "streams created")
        info = await answered(lambda: bus.js.stream_info("JOBS"), "JOBS stream info")
        assert info.config.num_replicas == 3 and info.cluster is not None
        await reader.create()
        tasks = [asyncio.create_task(publisher.run()), asyncio.create_task(reader.run())]
        await eventually(lambda: more_acked(publisher, 50), what="events acknowledged before the kill")

        # 1. Kill the JOBS leader: a new one is elected and publishing goes on.
        first = await leader(bus)
        killed = cluster.node(first)
        killed.kill()
        before = len(publisher.acked)
        await eventually(lambda: more_acked(publisher, before + 100), what="publishing goes on without a node")
        assert await leader(bus) != first

        # 2. The node comes back (as the supervisor restarts it) and catches up.
        restart_server(killed)
        await eventually(lambda: all_current(bus), what="the restarted node has caught up")
        # the consumer is a Raft group of its own: its delivered and acknowledged state must have caught up
        # too before its leader may be the next node killed
        await eventually(lambda: all_current(bus, consumer="reader"), what="the reader's consumer has caught up")

        # 3. Kill the new leader too: the stream now stands on the node that came back.
        second = await leader(bus)
        cluster.node(second).kill()
        before = len(publisher.acked)
        await eventually(lambda: more_acked(publisher, before + 100), what="publishing goes on after a second kill")
        publisher.stop.set()
        await tasks[0]

        # Nothing acknowledged is lost, nothing is stored twice, and the reader got it all.
        stored = await answered(lambda: bus.js.stream_info("JOBS"), "JOBS stream info after the kills")
        assert stored.state.messages == len(publisher.acked)
        assert sorted(publisher.acked.values()) == list(range(1, len(publisher.acked) + 1))

        async def everything_read() -> bool:
            return reader.seen >= set(publisher.acked)

        try:
            await eventually(everything_read, what="the consumer read every acknowledged event")
        except AssertionError as err:
            raise AssertionError(await reader_state(reader, tasks[1], publisher)) from err
        for seq in (1, len(publisher.acked) // 2, len(publisher.acked)):
            msg = await answered(lambda seq=seq: bus.js.get_msg("JOBS", seq), f"message {seq}")
            assert msg.headers and msg.headers["Nats-Msg-Id"] in publisher.acked
    finally:
        publisher.stop.set()
        reader.stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await bus.close()
        cluster.stop()


async def test_a_cluster_node_is_reachable_on_its_own_url_and_every_node_is_listed(tmp_path: Path) -> None:
    cluster: NatsCluster = start_nats_cluster(tmp_path / "nats", 3)
    try:
        assert cluster.url.count(",") == 2
        for node in cluster.nodes:
            bus = await Bus.connect(node.url, "one-node")
            try:
                await ensure_streams(bus.js, replicas=3)
                assert (await bus.js.stream_info("JOBS")).config.num_replicas == 3
            finally:
                await bus.close()
    finally:
        cluster.stop()


async def test_a_bucket_made_on_a_cluster_takes_publishes_once_its_leader_is_elected(tmp_path: Path) -> None:
    cluster: NatsCluster = start_nats_cluster(tmp_path / "nats", 3)
    bus = await Bus.connect(cluster.url, "leaders")
    try:
        await answered(lambda: bus.js.create_key_value(bucket="fresh", replicas=3), "bucket created")
        await wait_for_leaders(bus.js, ["KV_fresh"])
        info = await bus.js.stream_info("KV_fresh")
        assert info.cluster is not None and info.cluster.leader
        kv = await bus.js.key_value("fresh")
        assert await kv.create("k", b"v") == 1  # answered at the first try
        with pytest.raises(TimeoutError, match="KV_missing"):
            await wait_for_leaders(bus.js, ["KV_fresh", "KV_missing"], timeout=0.3)
    finally:
        await bus.close()
        cluster.stop()


async def test_a_single_server_has_its_leaders_at_once(bus: Bus) -> None:
    await wait_for_leaders(bus.js, ["JOBS", "AUDIT"], timeout=1.0)
