"""Read a whole stream back, for checks in tests and benchmarks."""

from __future__ import annotations

import asyncio

from nats.js.api import ConsumerConfig, DeliverPolicy

from trainyard.bus import Bus
from trainyard.events import JobEvent, decode_job_event
from trainyard.store import Projector, Store


async def read_raw(bus: Bus, stream: str, subject: str = ">") -> list[tuple[int, str, bytes]]:
    """Every message of ``stream`` as ``(seq, subject, data)``, in order."""
    info = await bus.js.stream_info(stream)
    last = info.state.last_seq
    if info.state.messages == 0:
        return []
    config = ConsumerConfig(deliver_policy=DeliverPolicy.ALL)
    filter_subject = info.config.subjects[0] if subject == ">" else subject
    sub = await bus.js.subscribe(filter_subject, stream=stream, ordered_consumer=True, config=config)
    out: list[tuple[int, str, bytes]] = []
    try:
        while not out or out[-1][0] < last:
            msg = await sub.next_msg(timeout=10)
            out.append((msg.metadata.sequence.stream, msg.subject, msg.data))
    finally:
        await sub.unsubscribe()
    return out


async def read_job_events(bus: Bus) -> list[JobEvent]:
    return [decode_job_event(data) for _, _, data in await read_raw(bus, "JOBS")]


async def project(bus: Bus, store: Store, *streams: str) -> None:
    """Run a projector per stream until Redis holds everything the stream holds, then stop it."""
    for stream in streams:
        projector = Projector(bus, store, stream)
        stop = asyncio.Event()
        task = asyncio.create_task(projector.run(stop))
        try:
            await projector.wait_for((await bus.js.stream_info(stream)).state.last_seq)
        finally:
            stop.set()
            await task
