"""Live updates over server-sent events: a stream polls the Redis projections
once a second on the server and sends only what changed, as HTML fragments the
htmx SSE extension swaps into the page (``sse-swap="<event>"``).

A page hands its stream the state it rendered (:class:`Baselines`), so a change
that lands between the render and the stream's first poll is still sent.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable

from fastapi import Request
from fastapi.responses import StreamingResponse

from trainyard_gateway.errors import UNAVAILABLE
from trainyard_gateway.security import still_verified

log = logging.getLogger("trainyard_gateway.console")

POLL_S = 1.0
#: A stream ends after this long; the browser reconnects at once (EventSource does).
STREAM_LIFETIME_S = 300.0

#: What a stream sends: (event name, HTML fragment) pairs.
Events = list[tuple[str, str]]


class Baselines:
    """What each page showed when rendered, keyed by a random view id, for the
    page's stream to start from (bounded: the oldest are dropped)."""

    def __init__(self, size: int = 512) -> None:
        self.size = size
        self.views: OrderedDict[str, dict[str, str]] = OrderedDict()

    def keep(self, signatures: dict[str, str]) -> str:
        view = secrets.token_urlsafe(9)
        self.views[view] = signatures
        while len(self.views) > self.size:
            self.views.popitem(last=False)
        return view

    def take(self, view: str | None) -> dict[str, str] | None:
        return self.views.pop(view, None) if view else None


def sse(event: str, html: str) -> str:
    """One SSE message: every line of the fragment as a ``data:`` line."""
    lines = html.strip().splitlines() or [""]
    return f"event: {event}\n" + "".join(f"data: {line}\n" for line in lines) + "\n"


def stream(request: Request, poll: Callable[[], Awaitable[Events]], interval_s: float = POLL_S) -> StreamingResponse:
    """An event stream that calls ``poll`` every ``interval_s`` and sends what it
    returns, while the caller's credential verifies: a session whose token is
    revoked or expires is cut off within ``interval_s`` (the browser's reconnect
    then gets 401), not left reading until the stream's lifetime ends."""

    async def body() -> AsyncIterator[str]:
        yield "retry: 2000\n: live\n\n"
        until = time.monotonic() + STREAM_LIFETIME_S
        while time.monotonic() < until:
            if not await still_verified(request):
                log.info("console live update ended: the session's credential no longer verifies")
                return
            try:
                events = await poll()
            except UNAVAILABLE as err:  # Redis or NATS away for a moment: keep the page, try again
                log.warning("console live update skipped: %r", err)
                events = []
            for event, html in events:
                yield sse(event, html)
            if not events:
                yield ": tick\n\n"  # a comment: finds a closed connection soon
            await asyncio.sleep(interval_s)

    return StreamingResponse(
        body(), media_type="text/event-stream", headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    )
