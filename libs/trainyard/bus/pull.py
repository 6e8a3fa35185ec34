"""Batches from a durable pull consumer, and what a fetched message says of itself, at a fixed cost per batch.

The stock client's ``PullSubscription.fetch`` takes each message of a batch
through ``Subscription.next_msg``, which makes a task, a timer and a UUID per
message; ``Msg.metadata`` builds dataclasses and a ``datetime`` per message.
On a consumer that takes every event of the system (heartbeats of a whole
fleet, every job event for the ledger) that per-message cost is most of what
the consumer spends.  :class:`BatchPull` keeps one inbox subscription whose
callback appends to a list, and keeps one pull request open at a time:

- ``fetch`` returns what has arrived (up to ``batch``) at once; with nothing
  there it opens a request (when none is open) and waits up to ``timeout``
  for the first message;
- ``fetch`` with ``timeout=0`` takes what the server holds for the consumer
  now: a ``no_wait`` request, answered in one burst (and a ``404`` when it
  held fewer than asked).  A consumer that lingers (``ConsumerSpec.linger_s``)
  uses it to take a trickle of messages in one read instead of one wake-up
  per message;
- a request asks for ``batch`` messages and expires after ``expires_s``; it is
  closed when the server has sent all of them or a status (``404`` no
  messages, ``408`` expired, ``409`` ...), or when its time is up on our clock
  (a status lost with a dropped connection);
- messages that arrive after a fetch returned wait for the next one, in order.

A request outlives the fetch that opened it by at most ``expires_s``, as the
stock client's does: a process that stops leaves nothing open for longer, and
what the server delivered to it meanwhile is redelivered after ``ack_wait``.

Every :data:`CHECK_EVERY_S` a fetch also reads the consumer's settings back
and raises :class:`ConsumerChanged` when they are not the ones it was made
with (another client gave it another filter, say): the consumer loop
subscribes again, which puts them back (``Bus.pull``), and handles again what
the consumer may have skipped since the last check that found it right (its
ack floor then), see trainyard.bus.reread.

:func:`message_meta` reads the stream sequence, the delivery count and the
stored time from the ack subject (``$JS.ACK.<stream>.<consumer>.<delivered>.
<stream seq>.<consumer seq>.<ns>.<pending>``, or the form with a domain and an
account hash in front); anything else goes through ``Msg.metadata``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import msgspec
import nats.errors
from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, ConsumerInfo, Header

log = logging.getLogger(__name__)

STATUS, DESCRIPTION = Header.STATUS.value, Header.DESCRIPTION.value
#: Statuses that end a pull request without an error: no messages now, request expired.
_DONE = {"404", "408"}
#: Slack for a status on its way when a request's time is up.
_GRACE_S = 0.1
_json = msgspec.json.Encoder()
#: How often a fetch reads its consumer's settings back (s).
CHECK_EVERY_S = 5.0
#: The settings a consumer is checked for: those that decide what it delivers and when a message is done.
CHECKED = ("durable_name", "filter_subject", "filter_subjects", "ack_policy", "max_deliver", "deliver_subject")


class ConsumerGone(nats.errors.Error):
    """The server ended a pull request with an error status (consumer deleted, leadership moved, ...)."""


class ConsumerChanged(nats.errors.Error):
    """The durable consumer's settings are not those this process made it with."""

    def __init__(self, stream: str, durable: str, changed: list[str], unsure_from: int | None = None) -> None:
        gap = f"; it may have skipped messages from stream sequence {unsure_from} on" if unsure_from else ""
        super().__init__(
            f"consumer {durable} on {stream} was changed by another client (or made by another version): "
            f"{', '.join(changed)}{gap}"
        )
        self.changed = changed
        #: The first stream sequence the consumer may have gone past while changed (None: unknown).
        self.unsure_from = unsure_from


def ack_floor(info: ConsumerInfo) -> int:
    """The stream sequence up to which the consumer has every message acked."""
    return (info.ack_floor.stream_seq or 0) if info.ack_floor else 0


def changed_settings(current: ConsumerConfig, wanted: ConsumerConfig) -> list[str]:
    """``<setting> is <now>, not <wanted>`` for each :data:`CHECKED` setting of ``current`` that is not ``wanted``'s."""
    out = []
    for name in CHECKED:
        now, then = getattr(current, name), getattr(wanted, name)
        if (now or None) != (then or None):
            out.append(f"{name} is {now!r}, not {then!r}")
    return out


class BatchPull:
    """A pull subscription to one durable consumer; see the module docstring."""

    def __init__(
        self, nc: Any, stream: str, durable: str, expires_s: float = 0.5, wanted: ConsumerConfig | None = None
    ) -> None:
        self.nc = nc
        self.stream, self.durable = stream, durable
        self.request_subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self.expires_s = expires_s
        #: The settings the consumer was made with; checked every CHECK_EVERY_S (None: never).
        self.wanted = wanted
        self._checked_at = 0.0
        #: The consumer's ack floor when its settings were last found right
        #: (None: not known): no message up to it was skipped.
        self.handled_up_to: int | None = None
        #: Set by Bus.pull when it found the consumer changed and put it back.
        self.changed: ConsumerChanged | None = None
        self.inbox = nc.new_inbox()
        self._sub: Any = None
        self._ready: list[Msg] = []
        self._arrived = asyncio.Event()
        self._open = 0  # messages the open request may still bring; 0: none open
        self._open_until = 0.0
        self._error: str | None = None

    async def start(self) -> BatchPull:
        self._sub = await self.nc.subscribe(self.inbox, cb=self._on_msg, pending_msgs_limit=-1, pending_bytes_limit=-1)
        return self

    async def unsubscribe(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None

    async def release(self) -> None:
        """Let go of this subscription (another took its place, or its loop
        stopped): unsubscribe, so the server delivers nothing more through
        the open request (it drops a request nobody listens to), and give
        back what came and was never taken, so the server delivers it again
        now rather than after ``ack_wait``."""
        self._open = 0
        try:
            await self.unsubscribe()
            ready, self._ready = self._ready, []
            for msg in ready:
                await msg.nak()
        except nats.errors.Error as err:  # a lost connection: what was not given back is redelivered after ack_wait
            log.warning("%s: could not let go of the subscription: %r", self.durable, err)

    async def _on_msg(self, msg: Msg) -> None:
        headers = msg.headers
        status = headers.get(STATUS) if headers else None
        if status is None:
            self._ready.append(msg)
            if self._open:
                self._open -= 1
        elif status == "100":  # an idle heartbeat: the request is still open
            return
        else:
            self._open = 0
            if status not in _DONE:
                self._error = f"{status} {headers.get(DESCRIPTION, '') if headers else ''}".strip()
        self._arrived.set()

    async def _request(self, batch: int, no_wait: bool = False) -> None:
        loop = asyncio.get_running_loop()
        self._open, self._open_until = batch, loop.time() + self.expires_s + _GRACE_S
        ask: dict[str, int | bool] = {"batch": batch, "expires": int(self.expires_s * 1e9)}
        if no_wait:
            ask["no_wait"] = True
        await self.nc.publish(self.request_subject, _json.encode(ask), reply=self.inbox)

    def _take(self, batch: int) -> list[Msg]:
        out = self._ready[:batch]
        del self._ready[:batch]
        return out

    def _raise_error(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise ConsumerGone(f"pull request ended: {error}")

    async def _fetch_stored(self, batch: int) -> list[Msg]:
        """Up to ``batch`` messages the server holds now; ``TimeoutError`` when it holds none.

        With a request open, what the server holds is already on its way
        through it: take what has arrived.  Else ask with ``no_wait`` and wait
        for that request's end (its last message, or its status)."""
        loop = asyncio.get_running_loop()
        if len(self._ready) < batch and not self._open:
            await self._request(batch - len(self._ready), no_wait=True)
            while self._open and loop.time() < self._open_until:
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), self._open_until - loop.time())
                except TimeoutError:
                    break
            self._open = 0  # done, or its end was lost with a connection
        self._raise_error()
        if not self._ready:
            raise nats.errors.TimeoutError
        return self._take(batch)

    async def check(self) -> None:
        """Raise :class:`ConsumerChanged` when the consumer's settings are not
        the ones it was made with (at most once per :data:`CHECK_EVERY_S`)."""
        now = asyncio.get_running_loop().time()
        if self.wanted is None or now - self._checked_at < CHECK_EVERY_S:
            return
        self._checked_at = now
        try:
            reply = await self.nc.request(f"$JS.API.CONSUMER.INFO.{self.stream}.{self.durable}", b"", timeout=5.0)
            answer = msgspec.json.decode(reply.data)
            if not isinstance(answer, dict) or "error" in answer:
                raise ValueError(answer.get("error") if isinstance(answer, dict) else answer)
            info = ConsumerInfo.from_response(answer)
        except Exception as err:  # noqa: BLE001 - a check that cannot be made now is made at the next interval
            log.warning("%s: could not read the consumer's settings back: %r", self.durable, err)
            return
        changed = changed_settings(info.config, self.wanted)
        if changed:
            since = self.handled_up_to if self.handled_up_to is not None else ack_floor(info)
            raise ConsumerChanged(self.stream, self.durable, changed, since + 1)
        self.handled_up_to = ack_floor(info)

    async def fetch(self, batch: int = 1, timeout: float | None = 5) -> list[Msg]:
        """Up to ``batch`` messages, in order: what is there, else the first to
        come within ``timeout``; with ``timeout`` 0, what the server holds now."""
        await self.check()
        if timeout is not None and timeout <= 0:
            return await self._fetch_stored(batch)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (timeout if timeout is not None else 3600.0)
        while not self._ready:
            self._raise_error()
            now = loop.time()
            if self._open and now > self._open_until:
                self._open = 0  # its end never came back (a lost connection): ask again
            if not self._open:
                await self._request(batch)
            if now >= deadline:
                raise nats.errors.TimeoutError
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), deadline - now)
            except TimeoutError:
                if not self._ready:
                    raise nats.errors.TimeoutError from None
        return self._take(batch)


def message_meta(msg: Any) -> tuple[int, int, float | None]:
    """(stream sequence, times delivered, when the stream stored it (s) or None) of a fetched message."""
    reply = getattr(msg, "reply", None)
    if isinstance(reply, str) and reply.startswith("$JS.ACK."):
        tokens = reply.split(".")
        if len(tokens) == 9:  # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ns>.<pending>
            return int(tokens[5]), int(tokens[4]), int(tokens[7]) / 1e9
        if len(tokens) >= 12:  # $JS.ACK.<domain>.<account hash>.<stream>.<consumer>.<delivered>.<sseq>...
            return int(tokens[7]), int(tokens[6]), int(tokens[9]) / 1e9
    meta = msg.metadata
    try:
        stored_at: float | None = meta.timestamp.timestamp()
    except Exception:  # noqa: BLE001 - no timestamp to read: the handler uses its own clock
        stored_at = None
    return meta.sequence.stream, meta.num_delivered or 1, stored_at
