"""The bus's own request path (every JetStream publish is one) against a real
nats-server: acks read as the stock client reads them, the server's refusals
raised as its errors, a subject no stream holds and a request nobody answers
fail at once or at their timeout, and nothing is left behind by any of them."""

from __future__ import annotations

import asyncio

import nats.errors
import pytest
from nats.js.errors import APIError, NoStreamResponseError

from trainyard.bus import Bus
from trainyard.bus.connection import pub_ack
from trainyard.events import subjects


def left_behind(bus: Bus) -> tuple[int, int]:
    """Requests still registered on the client: reply futures and subjects watched for a denial."""
    return len(bus.nc._resp_map), len(bus.nc._waiting)  # type: ignore[attr-defined]


async def test_an_ack_reads_as_the_stock_client_reads_it(bus: Bus) -> None:
    mine = await bus.publish_raw(subjects.intake("t"), b"one", {"Nats-Msg-Id": "a"})
    again = await bus.publish_raw(subjects.intake("t"), b"one", {"Nats-Msg-Id": "a"})
    stock = await bus.js.publish(subjects.intake("t"), b"two", headers={"Nats-Msg-Id": "b"})
    assert (mine.stream, mine.seq, bool(mine.duplicate)) == ("INTAKE", 1, False)
    assert (again.stream, again.seq, again.duplicate) == ("INTAKE", 1, True)
    assert (stock.stream, stock.seq) == ("INTAKE", 2)
    assert left_behind(bus) == (0, 0)


async def test_a_refusal_is_the_servers_error_with_its_code(bus: Bus) -> None:
    headers = {"Nats-Msg-Id": "c", "Nats-Expected-Last-Subject-Sequence": "5"}
    with pytest.raises(APIError) as refused:
        await bus.publish_raw(subjects.intake("t"), b"x", headers)
    assert refused.value.err_code == 10071  # wrong last sequence
    assert left_behind(bus) == (0, 0)


async def never_answer(msg: object) -> None:
    """A responder that takes every request and answers none."""


def test_an_error_ack_raises_and_an_unknown_field_is_ignored() -> None:
    with pytest.raises(APIError) as refused:
        pub_ack(b'{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 3"}}')
    assert refused.value.description == "wrong last sequence: 3"
    ack = pub_ack(b'{"stream":"JOBS","seq":9,"domain":"hub","val":"1"}')
    assert (ack.stream, ack.seq, ack.domain, ack.duplicate) == ("JOBS", 9, "hub", None)


async def test_a_subject_no_stream_holds_fails_at_once(bus: Bus) -> None:
    async with asyncio.timeout(2):  # not the publish timeout (10 s)
        with pytest.raises(NoStreamResponseError):
            await bus.publish_raw("nowhere.at.all", b"x", {"Nats-Msg-Id": "d"})
    assert left_behind(bus) == (0, 0)


async def test_an_unanswered_request_times_out_and_is_forgotten(bus: Bus) -> None:
    await bus.nc.subscribe("silent.service", cb=never_answer)
    with pytest.raises(nats.errors.TimeoutError):
        await bus.nc.request("silent.service", b"?", timeout=0.2)
    assert left_behind(bus) == (0, 0)


async def test_a_cancelled_request_is_forgotten_and_later_ones_work(bus: Bus) -> None:
    await bus.nc.subscribe("silent.service", cb=never_answer)
    waiting = asyncio.create_task(bus.nc.request("silent.service", b"?", timeout=30))
    await asyncio.sleep(0.05)
    assert left_behind(bus) == (1, 1)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert left_behind(bus) == (0, 0)
    acks = await asyncio.gather(
        *(bus.publish_raw(subjects.intake("t"), b"%d" % i, {"Nats-Msg-Id": f"m{i}"}) for i in range(50))
    )
    assert sorted(a.seq for a in acks) == list(range(1, 51))
    assert left_behind(bus) == (0, 0)
