"""``BatchPull`` and ``message_meta`` against a real nats-server: batches come
in stream order and never larger than asked, a fetch with nothing there waits
for the first message (or times out), what a fetched message says of itself
matches the stock client's ``Msg.metadata``, and a consumer deleted under a
waiting fetch is an error, not a hang."""

from __future__ import annotations

import asyncio

import nats.errors
import pytest

from trainyard.bus import Bus, ConsumerSpec
from trainyard.bus.pull import BatchPull, ConsumerGone, message_meta
from trainyard.events import subjects


def spec(durable: str = "pull-test", ack_wait_s: float = 30.0) -> ConsumerSpec:
    return ConsumerSpec(stream="INTAKE", durable=durable, filter_subject=subjects.INTAKE_ALL, ack_wait_s=ack_wait_s)


async def publish(bus: Bus, count: int) -> None:
    for i in range(count):
        await bus.js.publish(subjects.intake("t"), b"m%d" % i)


async def test_batches_come_in_stream_order_and_no_larger_than_asked(bus: Bus) -> None:
    sub = await bus.pull(spec())
    await publish(bus, 7)
    got: list[bytes] = []
    sizes: list[int] = []
    async with asyncio.timeout(10):
        while len(got) < 7:
            msgs = await sub.fetch(3, timeout=2)
            sizes.append(len(msgs))
            got += [m.data for m in msgs]
            for m in msgs:
                await m.ack()
    assert got == [b"m%d" % i for i in range(7)]
    assert max(sizes) <= 3
    await sub.unsubscribe()


async def test_a_fetch_with_nothing_there_times_out_as_a_timeout_error(bus: Bus) -> None:
    sub = await bus.pull(spec())
    with pytest.raises(nats.errors.TimeoutError):
        await sub.fetch(10, timeout=0.3)
    with pytest.raises(TimeoutError):  # what the consumer loop catches
        await sub.fetch(10, timeout=0.1)
    await sub.unsubscribe()


async def test_a_waiting_fetch_returns_the_first_message_published_meanwhile(bus: Bus) -> None:
    sub = await bus.pull(spec())
    waiting = asyncio.create_task(sub.fetch(100, timeout=10))
    await asyncio.sleep(0.1)  # the fetch has opened its request and waits
    assert not waiting.done()
    await publish(bus, 1)
    msgs = await asyncio.wait_for(waiting, 10)
    assert [m.data for m in msgs] == [b"m0"]
    await sub.unsubscribe()


async def test_a_request_that_expired_on_the_server_is_opened_again(bus: Bus) -> None:
    sub = BatchPull(bus.nc, "INTAKE", "pull-test", expires_s=0.2)
    await bus.pull(spec())  # makes the durable consumer
    await sub.start()
    with pytest.raises(nats.errors.TimeoutError):
        await sub.fetch(10, timeout=0.6)  # outlives three requests
    await publish(bus, 2)
    async with asyncio.timeout(10):
        msgs = await sub.fetch(10, timeout=5)
    assert [m.data for m in msgs][:1] == [b"m0"]
    await sub.unsubscribe()


async def test_message_meta_matches_the_stock_metadata_also_on_redelivery(bus: Bus) -> None:
    sub = await bus.pull(spec())
    await publish(bus, 2)
    async with asyncio.timeout(10):
        first: list = []
        while len(first) < 2:
            first += await sub.fetch(2, timeout=2)
        for m in first:
            meta = m.metadata
            seq, delivered, stored_at = message_meta(m)
            assert (seq, delivered) == (meta.sequence.stream, meta.num_delivered) == (seq, 1)
            assert stored_at == pytest.approx(meta.timestamp.timestamp(), abs=1e-6)  # datetime keeps microseconds
        await first[0].nak()
        await first[1].ack()
        again = await sub.fetch(1, timeout=5)
    seq, delivered, stored_at = message_meta(again[0])
    assert (seq, delivered) == (first[0].metadata.sequence.stream, 2)
    assert stored_at == pytest.approx(again[0].metadata.timestamp.timestamp(), abs=1e-6)
    await sub.unsubscribe()


def test_message_meta_reads_the_ack_subject_with_a_domain_and_account_hash() -> None:
    class Fetched:
        reply = "$JS.ACK.hub.ACCHASH.INTAKE.durable.3.41.40.1700000000123456789.5.token"

    assert message_meta(Fetched()) == (41, 3, 1700000000.123456789)


async def test_a_consumer_deleted_under_a_waiting_fetch_is_an_error(bus: Bus) -> None:
    sub = await bus.pull(spec(durable="doomed"))
    waiting = asyncio.create_task(sub.fetch(10, timeout=10))
    await asyncio.sleep(0.1)
    await bus.js.delete_consumer("INTAKE", "doomed")
    with pytest.raises(ConsumerGone):
        await asyncio.wait_for(waiting, 10)
    await sub.unsubscribe()
