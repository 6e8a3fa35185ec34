"""Messages read back from their stream by sequence, to be handled again.

A durable consumer whose filter another client changed goes past the
messages the new filter does not match, and putting the filter back does not
bring it back to them (see docs/security.md).  The consumer loop then hands
its subscription every message of its own filter after the consumer's ack
floor, read one by one from the stream (``STREAM.MSG.GET`` with
``next_by_subj``), before it pulls again.  Handlers are idempotent (a
redelivery after ``ack_wait`` does the same), so a message that was not
skipped after all is handled a second time to no effect.

A :class:`Reread` message is settled by the loop that reads it, not by the
server: ``ack`` and ``term`` (after its dead letter) end it, ``nak`` hands it
again after the delay.
"""

from __future__ import annotations

import datetime as dt

import msgspec
import nats.js.errors
from nats.js import JetStreamContext


class _Sequence(msgspec.Struct, frozen=True):
    stream: int


class _Meta(msgspec.Struct, frozen=True):
    sequence: _Sequence
    num_delivered: int
    timestamp: dt.datetime


class Reread:
    """One message read back from its stream; ``fate`` says how it was settled."""

    def __init__(self, subject: str, data: bytes, seq: int, stored_at: dt.datetime) -> None:
        self.subject = subject
        self.data = data
        self.reply: str | None = None  # not delivered by a consumer: no ack subject
        self.seq = seq
        self.stored_at = stored_at
        self.delivered = 1
        self.fate: str | None = None  # "ack", "nak" or "term" once settled
        self.delay = 0.0

    @property
    def metadata(self) -> _Meta:
        return _Meta(_Sequence(self.seq), self.delivered, self.stored_at)

    async def ack(self) -> None:
        self.fate = "ack"

    async def nak(self, delay: float | None = None) -> None:
        self.fate, self.delay = "nak", delay or 0.0

    async def term(self) -> None:
        self.fate = "term"


async def read(js: JetStreamContext, stream: str, first: int, last: int, subject: str, limit: int) -> list[Reread]:
    """Up to ``limit`` messages of ``stream`` on ``subject`` (a filter) from
    sequence ``first`` to ``last``, in order."""
    out: list[Reread] = []
    seq = first
    while seq <= last and len(out) < limit:
        try:
            raw = await js.get_msg(stream, seq, subject=subject, next=True)
        except nats.js.errors.NotFoundError:
            break  # nothing more on the filter
        if raw.seq is None or raw.seq > last:
            break
        stored_at = raw.time or dt.datetime.now(dt.UTC)  # the server always sends it
        out.append(Reread(raw.subject or "", raw.data or b"", raw.seq, stored_at))
        seq = raw.seq + 1
    return out
