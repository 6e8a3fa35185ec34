"""The bus against a real nats-server: no message, however large or broken,
costs a service its connection or its consumer."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import msgspec
import pytest
from nats.aio.msg import Msg

from trainyard.bus import Bus, ConsumerSpec, Delivery, Outcome, PayloadTooLarge, Subscription, run_consumer
from trainyard.bus.client import message_size
from trainyard.bus.consumer import DEAD_LETTER_KEEP_BYTES
from trainyard.events import subjects
from trainyard.local.servers import Server
from trainyard.testing.waiting import eventually

SUBJECT = "trainyard.intake.acme"


class Recorder(Subscription[bytes]):
    """A batch handler that records what it handled: b"bad" is poison, b"deep"
    makes the whole batch fail as JSON nested too deeply would, b"close" closes
    the connection under the consumer (once)."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.handled: list[bytes] = []
        self.closed = False

    def decode(self, subject: str, data: bytes) -> bytes:
        return data

    async def handle(self, batch: Sequence[Delivery[bytes]]) -> list[Outcome]:
        if any(d.event == b"deep" for d in batch):
            raise RecursionError("maximum recursion depth exceeded while deserializing an object")
        outcomes: list[Outcome] = []
        for d in batch:
            if d.event == b"close" and not self.closed:
                self.closed = True
                await self.bus.nc.close()  # the acks that follow fail
            if d.event.startswith(b"bad"):
                outcomes.append(Outcome.poison(f"bad message of {len(d.event)} bytes"))
            else:
                self.handled.append(d.event)
                outcomes.append(Outcome.done())
        return outcomes


async def consume(bus: Bus, recorder: Recorder, ack_wait_s: float = 30.0) -> tuple[asyncio.Task[None], asyncio.Event]:
    stop = asyncio.Event()
    spec = ConsumerSpec(stream="INTAKE", durable="t", filter_subject=subjects.INTAKE_ALL, ack_wait_s=ack_wait_s)
    return asyncio.create_task(run_consumer(bus, spec, recorder, stop)), stop


async def dead_letters(bus: Bus) -> list[Msg]:
    info = await bus.js.stream_info("DEADLETTER")
    if info.state.messages == 0:
        return []
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        out.append(await bus.js.get_msg("DEADLETTER", seq))
    return out


async def test_a_publish_over_max_payload_is_refused_before_sending_and_the_connection_stays(bus: Bus) -> None:
    limit = bus.nc.max_payload
    with pytest.raises(PayloadTooLarge, match=f"larger than the server's max_payload of {limit} bytes"):
        await bus.publish_raw(SUBJECT, b"x" * (limit - 10), {"Nats-Msg-Id": "big"})
    with pytest.raises(PayloadTooLarge):
        await bus.publish(SUBJECT, {"blob": "y" * limit}, msg_id="big-2")
    # Exactly at the limit, headers included, goes through.
    headers = {"Nats-Msg-Id": "edge"}
    data = b"z" * (limit - message_size(b"", headers))
    assert message_size(data, headers) == limit
    ack = await bus.publish_raw(SUBJECT, data, headers)
    assert ack.seq == 1
    assert bus.nc.is_connected and bus.nc.stats["reconnects"] == 0
    assert (await bus.publish(SUBJECT, {"ok": True}, msg_id="after")).seq == 2


async def test_after_a_fatal_server_error_the_client_reconnects_and_consumers_carry_on(bus: Bus) -> None:
    recorder = Recorder(bus)
    task, stop = await consume(bus, recorder)
    try:
        await bus.publish_raw(SUBJECT, b"before", {"Nats-Msg-Id": "b"})
        await eventually(lambda: asyncio.sleep(0, recorder.handled == [b"before"]))
        # Bypass the bus's check: data under the limit, headers over it.  The
        # server answers "Maximum Payload Violation" and drops the connection.
        await bus.nc.publish(SUBJECT, b"x" * (bus.nc.max_payload - 8), headers={"Pad": "p" * 64})

        async def reconnected() -> bool:
            return bus.nc.stats["reconnects"] >= 1 and bus.nc.is_connected

        await eventually(reconnected)
        assert not bus.nc.is_closed
        await bus.publish_raw(SUBJECT, b"after", {"Nats-Msg-Id": "a"})
        await eventually(lambda: asyncio.sleep(0, recorder.handled == [b"before", b"after"]))
        assert not task.done()
    finally:
        stop.set()
        await task


async def test_a_connection_closed_under_a_consumer_is_opened_again_and_failed_acks_are_redelivered(bus: Bus) -> None:
    recorder = Recorder(bus)
    task, stop = await consume(bus, recorder, ack_wait_s=1.0)
    try:
        await bus.publish_raw(SUBJECT, b"close", {"Nats-Msg-Id": "c"})
        await eventually(lambda: asyncio.sleep(0, bus.generation >= 1 and bus.nc.is_connected))
        await bus.publish_raw(SUBJECT, b"later", {"Nats-Msg-Id": "l"})
        # The ack of "close" was lost with the connection: it comes again, once more.
        await eventually(lambda: asyncio.sleep(0, sorted(recorder.handled) == [b"close", b"close", b"later"]))
        assert not task.done()
    finally:
        stop.set()
        await task


async def test_a_dead_letter_keeps_a_truncated_copy_with_the_original_size_and_subject(bus: Bus) -> None:
    recorder = Recorder(bus)
    big = b"bad" + b"\x00" * (bus.nc.max_payload - 200)
    await bus.publish_raw(SUBJECT, big, {"Nats-Msg-Id": "huge"})
    await bus.publish_raw(SUBJECT, b"good", {"Nats-Msg-Id": "g"})
    task, stop = await consume(bus, recorder)
    try:
        [dead] = await eventually(lambda: dead_letters(bus))
        await eventually(lambda: asyncio.sleep(0, recorder.handled == [b"good"]))
    finally:
        stop.set()
        await task
    assert dead.subject == "trainyard.deadletter.intake"
    assert dead.data == big[:DEAD_LETTER_KEEP_BYTES]
    assert dead.headers["Trainyard-Size"] == str(len(big))
    assert dead.headers["Trainyard-Subject"] == SUBJECT
    assert dead.headers["Trainyard-Stream-Seq"] == "1"
    assert dead.headers["Trainyard-Reason"] == f"bad message of {len(big)} bytes"
    assert f"of {len(big)} bytes" in dead.headers["Trainyard-Truncated"]
    assert bus.nc.stats["reconnects"] == 0


async def test_a_batch_failing_on_one_deeply_nested_message_dead_letters_only_that_one(bus: Bus) -> None:
    for i, data in enumerate([b"one", b"deep", b"two"]):
        await bus.publish_raw(SUBJECT, data, {"Nats-Msg-Id": f"m{i}"})
    recorder = Recorder(bus)
    task, stop = await consume(bus, recorder)
    try:
        [dead] = await eventually(lambda: dead_letters(bus))
        await eventually(lambda: asyncio.sleep(0, sorted(recorder.handled) == [b"one", b"two"]))
        assert not task.done()
    finally:
        stop.set()
        await task
    assert dead.data == b"deep" and dead.headers["Trainyard-Reason"] == "cannot be decoded: nested too deeply"


async def test_a_reason_with_line_breaks_cannot_break_the_dead_letter_headers(bus: Bus) -> None:
    class Liar(Recorder):
        async def handle(self, batch: Sequence[Delivery[bytes]]) -> list[Outcome]:
            return [
                Outcome.failed(msgspec.ValidationError("line one\r\nNats-Msg-Id: forged\r\n" + "z" * 5000))
                for _ in batch
            ]

    await bus.publish_raw(SUBJECT, b"x", {"Nats-Msg-Id": "x"})
    task, stop = await consume(bus, Liar(bus))
    try:
        [dead] = await eventually(lambda: dead_letters(bus))
    finally:
        stop.set()
        await task
    reason = dead.headers["Trainyard-Reason"]
    assert reason.startswith("cannot be decoded: line one  Nats-Msg-Id: forged") and len(reason) <= 1000
    assert dead.headers["Nats-Msg-Id"] == "dlq:INTAKE:1"
    assert bus.nc.stats["reconnects"] == 0


async def test_bus_close_is_final(nats_server: Server) -> None:
    bus = await Bus.connect(nats_server.url, name="t")
    await bus.close()
    await asyncio.sleep(0.2)  # give a wrongly started reopen the chance to run
    assert bus.nc.is_closed and bus.generation == 0
