"""The agent's outbox keeps a report while NATS is away, saying so at each
retry, and publishes it once NATS is back; a report made again (after an
agent restart) under its message id is stored once."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from trainyard.agent.outbox import Outbox
from trainyard.bus import Bus, ensure_streams
from trainyard.events import subjects
from trainyard.events.work import ProcessExited, decode_work
from trainyard.local.servers import Server, start_nats
from trainyard.testing.waiting import eventually

SUBJECT = subjects.work_reports("local", "n1")


def exited(rank: int) -> ProcessExited:
    return ProcessExited(at=1.0, job_id="j", tenant="acme", run_id="r", node_id="n1", rank=rank, exit_code=0)


async def stored(bus: Bus) -> list[ProcessExited]:
    sub = await bus.js.subscribe(SUBJECT, stream="WORK", ordered_consumer=True)
    got = []
    try:
        while True:
            msg = await sub.next_msg(timeout=1)
            got.append(decode_work(msg.data))
    except TimeoutError:
        return got  # type: ignore[return-value]
    finally:
        await sub.unsubscribe()


async def test_a_report_waits_for_nats_and_is_published_once_it_is_back(
    nats_server: Server, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A publish waits 1 s for its ack (not the default 10 s), so the two retries while NATS is away come quickly.
    bus = await Bus.connect(nats_server.url, name="agent-outbox-test", publish_timeout=1.0)
    await ensure_streams(bus.js)
    outbox = Outbox(bus, SUBJECT, first_delay_s=0.05, max_delay_s=0.2)
    stop = asyncio.Event()
    task = asyncio.ensure_future(outbox.run(stop))
    sent: list[int] = []
    back: Server | None = None
    try:
        outbox.put(exited(0), "r:0:exited", lambda: sent.append(0))
        await eventually(_count(outbox, 1), what="the first report published")
        nats_server.stop()
        with caplog.at_level(logging.WARNING, logger="trainyard.agent.outbox"):
            outbox.put(exited(1), "r:1:exited", lambda: sent.append(1))
            await eventually(_retried(caplog, 2), what="two logged retries")
            assert sent == [0]
            back = start_nats(tmp_path / "nats", port=nats_server.port)
            await eventually(_count(outbox, 2), timeout=60, what="the report published after NATS came back")
        assert sent == [0, 1]
        outbox.put(exited(1), "r:1:exited")  # made again after a restart: stored once
        await eventually(_count(outbox, 3), what="the repeat acknowledged")
        assert [r.rank for r in await stored(bus)] == [0, 1]
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await bus.close()
        if back is not None:
            back.stop()


def _count(outbox: Outbox, n: int):  # type: ignore[no-untyped-def]
    async def check() -> bool:
        return outbox.sent >= n

    return check


def _retried(caplog: pytest.LogCaptureFixture, n: int):  # type: ignore[no-untyped-def]
    async def check() -> bool:
        return sum("r:1:exited not published" in r.getMessage() for r in caplog.records) >= n

    return check
