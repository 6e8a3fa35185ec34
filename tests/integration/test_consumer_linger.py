"""``ConsumerSpec.linger_s`` against a real nats-server: a consumer that
lingers fetches at most once per ``linger_s``, so a trickle of messages comes
in few batches; the first message after a quiet spell is handled at once,
and none waits much longer than ``linger_s``."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from trainyard.bus import Bus, ConsumerSpec, Delivery, Outcome, Subscription, run_consumer
from trainyard.events import subjects


class Batches(Subscription[bytes]):
    def __init__(self) -> None:
        self.batches: list[list[bytes]] = []
        self.arrived = asyncio.Event()

    def decode(self, subject: str, data: bytes) -> bytes:
        return data

    async def handle(self, batch: Sequence[Delivery[bytes]]) -> list[Outcome]:
        self.batches.append([d.event for d in batch])
        self.arrived.set()
        return [Outcome.done()] * len(batch)


def spec(linger_s: float) -> ConsumerSpec:
    return ConsumerSpec(stream="INTAKE", durable="t", filter_subject=subjects.INTAKE_ALL, linger_s=linger_s)


async def trickle(bus: Bus, linger_s: float, count: int) -> list[list[bytes]]:
    """``count`` messages 20 ms apart to a consumer lingering ``linger_s``; the batches it handled."""
    recorder, stop = Batches(), asyncio.Event()
    task = asyncio.create_task(run_consumer(bus, spec(linger_s), recorder, stop))
    try:
        await asyncio.sleep(0.3)  # the consumer exists and waits
        for i in range(count):
            await bus.js.publish(subjects.intake("t"), b"m%d" % i)
            await asyncio.sleep(0.02)
        async with asyncio.timeout(10):
            while sum(len(b) for b in recorder.batches) < count:
                recorder.arrived.clear()
                await recorder.arrived.wait()
    finally:
        stop.set()
        await task
    return recorder.batches


async def test_a_lingering_consumer_takes_a_trickle_after_its_first_message_as_one_batch(bus: Bus) -> None:
    batches = await trickle(bus, linger_s=3.0, count=5)  # the next fetch comes 2.5-3 s after m0
    assert batches == [[b"m0"], [b"m1", b"m2", b"m3", b"m4"]]


async def test_without_linger_a_trickle_comes_in_several_batches(bus: Bus) -> None:
    batches = await trickle(bus, linger_s=0.0, count=5)
    assert len(batches) > 1
    assert [m for b in batches for m in b] == [b"m0", b"m1", b"m2", b"m3", b"m4"]


async def test_a_lone_message_after_a_quiet_spell_is_handled_at_once(bus: Bus) -> None:
    recorder, stop = Batches(), asyncio.Event()
    task = asyncio.create_task(run_consumer(bus, spec(linger_s=30.0), recorder, stop))
    try:
        await asyncio.sleep(1.2)  # the consumer exists and has waited in vain more than once
        await bus.js.publish(subjects.intake("t"), b"m0")
        async with asyncio.timeout(10):  # far less than linger_s
            await recorder.arrived.wait()
    finally:
        stop.set()
        await task
    assert recorder.batches == [[b"m0"]]


async def test_a_backlog_is_taken_a_full_batch_per_fetch(bus: Bus) -> None:
    for i in range(10):
        await bus.js.publish(subjects.intake("t"), b"m%d" % i)
    recorder, stop = Batches(), asyncio.Event()
    lingering = ConsumerSpec(stream="INTAKE", durable="t", filter_subject=subjects.INTAKE_ALL, linger_s=0.05, batch=4)
    task = asyncio.create_task(run_consumer(bus, lingering, recorder, stop))
    try:
        async with asyncio.timeout(10):
            while sum(len(b) for b in recorder.batches) < 10:
                recorder.arrived.clear()
                await recorder.arrived.wait()
    finally:
        stop.set()
        await task
    assert [len(b) for b in recorder.batches] == [4, 4, 2]
    assert [m for b in recorder.batches for m in b] == [b"m%d" % i for i in range(10)]
