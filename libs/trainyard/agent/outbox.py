"""The agent's reports on their way to the WORK stream.

Reports are published one at a time, in the order they were put, each under
its message id (so a report published again, after a restart or a lost ack,
is stored once).  While NATS is away a report is retried with a growing
delay (0.2 s, doubling, at most 5 s) for as long as it takes, each failure
logged; nothing is dropped.  ``on_sent`` is called once the stream has it
(the executor records there that the report need not be made again).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from trainyard.bus import Bus
from trainyard.events.work import WorkReport

log = logging.getLogger(__name__)


class Outbox:
    def __init__(self, bus: Bus, subject: str, *, first_delay_s: float = 0.2, max_delay_s: float = 5.0) -> None:
        self.bus = bus
        self.subject = subject
        self.first_delay_s = first_delay_s
        self.max_delay_s = max_delay_s
        self._queue: asyncio.Queue[tuple[WorkReport, str, Callable[[], None] | None]] = asyncio.Queue()
        self.sent = 0  # reports the stream took

    def put(self, report: WorkReport, msg_id: str, on_sent: Callable[[], None] | None = None) -> None:
        self._queue.put_nowait((report, msg_id, on_sent))

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    async def run(self, stop: asyncio.Event) -> None:
        """Publish reports until ``stop``."""
        while not stop.is_set():
            getter = asyncio.ensure_future(self._queue.get())
            stopped = asyncio.ensure_future(stop.wait())
            await asyncio.wait([getter, stopped], return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            if not getter.done():
                getter.cancel()
                return
            report, msg_id, on_sent = getter.result()
            if await self._publish(report, msg_id, stop) and on_sent is not None:
                on_sent()

    async def _publish(self, report: WorkReport, msg_id: str, stop: asyncio.Event) -> bool:
        delay = self.first_delay_s
        tries = 0
        while True:
            tries += 1
            try:
                await self.bus.publish(self.subject, report, msg_id=msg_id)
                self.sent += 1
                if tries > 1:
                    log.info("report %s published after %d tries", msg_id, tries)
                return True
            except Exception as err:  # noqa: BLE001 - NATS away or refusing: keep the report, try again
                log.warning("report %s not published (%r); try %d, again in %.1fs", msg_id, err, tries, delay)
            if stop.is_set():
                log.warning("stopping with report %s unpublished: it is made again at the next start", msg_id)
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
            delay = min(delay * 2, self.max_delay_s)
