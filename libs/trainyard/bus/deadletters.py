"""Reading and replaying dead letters.

A dead letter (written by :func:`trainyard.bus.consumer.dead_letter`) is a
copy of a message a consumer gave up on, on ``trainyard.deadletter.<stream>``
in the DEADLETTER stream: the first :data:`DEAD_LETTER_KEEP_BYTES` of its
data, with headers naming the reason, the original subject, the original
stream sequence and size, and whether the copy was cut short.

Replaying republishes the original message on its original subject, with a
new message id, so the consumer that gave up sees it again.  A dead letter's
headers are written by whoever may publish dead letters, so they are not
trusted: the stream comes from the dead letter's own subject (which only that
stream's consumers may write), and the subject and data are those of the
original message as the stream stored it, looked up by the sequence the dead
letter names.  A dead letter whose subject or data is not the original's
(forged, or pointing at another message) is refused with the reason, as is
one whose original has left its stream.  Only
commands are replayed: an intake command (admission decides idempotently by
job id) or a node command or event (health's state machine refuses what no
longer applies).  A JOBS event is a fact of the source of truth, still in the
JOBS stream and written only by its producer: a second copy would record the
fact twice, so it is refused, as is telemetry (samples are only worth
anything when fresh).

Discarding removes a dead letter from the DEADLETTER stream once someone has
dealt with it (or decided it needs nothing); nothing is published.
"""

from __future__ import annotations

import uuid

import msgspec
import nats.js.errors

from trainyard.bus.client import header_value
from trainyard.bus.connection import Bus
from trainyard.events import subjects

STREAM = "DEADLETTER"

#: Streams whose dead letters may be replayed, and why the others may not.
REPLAYABLE = frozenset({"INTAKE", "NODES"})
NOT_REPLAYABLE = {
    "JOBS": "a JOBS event is a fact that is still in the JOBS stream, written only by its producer; "
    "publishing it again would record it twice",
    "TELEMETRY": "telemetry is only worth anything fresh; the node's next sample replaces it",
}

#: The streams whose consumers dead-letter messages.
SOURCES = ("INTAKE", "JOBS", "NODES", "TELEMETRY")

_PREFIX = subjects.deadletter("x")[: -len("x")]  # "trainyard.deadletter."


class DeadLetter(msgspec.Struct, kw_only=True):
    """One dead letter, as listed (``data`` empty) or shown in full."""

    seq: int  # its sequence in the DEADLETTER stream
    at: float  # when it was dead-lettered (Unix time)
    stream: str  # the stream the message came from
    subject: str  # the message's original subject
    stream_seq: int | None  # its sequence in that stream
    reason: str
    size: int  # the original message's size in bytes
    kept: int  # bytes kept in the copy
    truncated: bool  # the copy keeps only the first `kept` bytes
    replayable: bool  # whole, and from a stream whose messages are replayed
    data: str = ""  # the kept bytes (UTF-8, undecodable bytes replaced); only when shown


class Replayed(msgspec.Struct):
    seq: int  # the dead letter's sequence
    stream: str
    subject: str
    replayed_seq: int  # the new message's sequence in its stream
    msg_id: str


class DeadLetterNotFound(Exception):
    pass


class NotReplayable(Exception):
    """The dead letter cannot be replayed; the message says why and what to do."""


def source_stream(deadletter_subject: str) -> str:
    """The stream a dead letter's subject names (``trainyard.deadletter.intake`` -> ``INTAKE``)."""
    return deadletter_subject.removeprefix(_PREFIX).upper()


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _record(raw: nats.js.api.RawStreamMsg, with_data: bool) -> DeadLetter:
    headers = raw.headers or {}
    data = raw.data or b""
    stream = source_stream(raw.subject or "")
    size = _int(headers.get("Trainyard-Size"))
    truncated = "Trainyard-Truncated" in headers or (size is not None and size > len(data))
    return DeadLetter(
        seq=raw.seq or 0,
        at=raw.time.timestamp() if raw.time else 0.0,
        stream=stream,
        subject=headers.get("Trainyard-Subject", ""),
        stream_seq=_int(headers.get("Trainyard-Stream-Seq")),
        reason=headers.get("Trainyard-Reason", ""),
        size=size if size is not None else len(data),
        kept=len(data),
        truncated=truncated,
        replayable=not truncated and stream in REPLAYABLE and bool(headers.get("Trainyard-Subject")),
        data=data.decode("utf-8", errors="replace") if with_data else "",
    )


async def _get(bus: Bus, seq: int) -> nats.js.api.RawStreamMsg | None:
    if not 0 < seq < 2**64:  # no stream sequence: the server would answer "bad request", not "no such message"
        return None
    try:
        return await bus.js.get_msg(STREAM, seq)
    except nats.js.errors.NotFoundError:
        return None


async def read(bus: Bus, seq: int) -> DeadLetter:
    raw = await _get(bus, seq)
    if raw is None:
        raise DeadLetterNotFound(f"no dead letter {seq} (it may have aged out of the {STREAM} stream)")
    return _record(raw, with_data=True)


#: The most dead letters one listing looks at (a filter by stream may skip many).
SCAN_LIMIT = 10_000


async def listing(bus: Bus, limit: int = 50, stream: str | None = None, before: int | None = None) -> list[DeadLetter]:
    """Up to ``limit`` dead letters, newest first: those from ``stream`` only
    when named, and below sequence ``before`` when given (to page back).  At
    most :data:`SCAN_LIMIT` dead letters are looked at."""
    letters, _ = await listing_page(bus, limit, stream, before)
    return letters


async def listing_page(
    bus: Bus, limit: int = 50, stream: str | None = None, before: int | None = None
) -> tuple[list[DeadLetter], int | None]:
    """:func:`listing`, and the ``before`` of the next page: the lowest
    sequence looked at, or None when the stream's first was looked at."""
    info = await bus.js.stream_info(STREAM)
    first, last = max(info.state.first_seq, 1), info.state.last_seq
    if before is not None:
        last = min(last, before - 1)
    wanted = subjects.deadletter(stream) if stream is not None else None
    out: list[DeadLetter] = []
    seq = last + 1
    while seq > max(first, last - SCAN_LIMIT + 1) and len(out) < limit:
        seq -= 1
        raw = await _get(bus, seq)
        if raw is not None and (wanted is None or raw.subject == wanted):
            out.append(_record(raw, with_data=False))
    return out, (seq if seq > first else None)


async def _original(bus: Bus, seq: int, letter: DeadLetter, data: bytes) -> nats.js.api.RawStreamMsg:
    """The message dead letter ``seq`` is a copy of, as its stream stored it;
    :class:`NotReplayable` unless the dead letter's subject and data are that
    message's."""
    if letter.stream_seq is None:
        raise NotReplayable(f"dead letter {seq} does not name its message's sequence in {letter.stream}")
    try:
        original = await bus.js.get_msg(letter.stream, letter.stream_seq) if letter.stream_seq > 0 else None
    except nats.js.errors.NotFoundError:
        original = None
    where = f"{letter.stream} seq {letter.stream_seq}"
    if original is None:
        raise NotReplayable(
            f"dead letter {seq} names {where}, which is not in the stream (aged out, removed or never there); "
            "only a message the stream still holds can be checked and replayed"
        )
    if original.subject != letter.subject:
        raise NotReplayable(
            f"dead letter {seq} says its message was on {letter.subject!r}, but {where} is on "
            f"{original.subject!r}: not replayed"
        )
    if (original.data or b"") != data:
        raise NotReplayable(f"dead letter {seq} does not hold the data of {where}: not replayed")
    return original


async def replay(bus: Bus, seq: int, actor: str = "") -> Replayed:
    """Publish the message dead letter ``seq`` copies again on its original
    subject, with a new message id, naming ``actor`` (who asked) in a header;
    :class:`NotReplayable` when it may not be (see the module docstring)."""
    letter = await read(bus, seq)
    where = f"{letter.stream} seq {letter.stream_seq}" if letter.stream_seq is not None else letter.stream
    if letter.truncated:
        raise NotReplayable(
            f"dead letter {seq} kept only the first {letter.kept} of {letter.size} bytes, so it cannot be replayed; "
            f"the whole message may still be in {where}"
        )
    if letter.stream not in REPLAYABLE:
        why = NOT_REPLAYABLE.get(letter.stream, f"dead letters of {letter.stream} are not replayed")
        raise NotReplayable(f"dead letter {seq} came from {letter.stream} and is not replayed: {why}")
    if not letter.subject or not letter.subject.startswith(f"{subjects.PREFIX}."):
        raise NotReplayable(f"dead letter {seq} does not name a Trainyard subject to replay it on")
    raw = await _get(bus, seq)
    assert raw is not None  # read() found it a moment ago; retention works in days
    original = await _original(bus, seq, letter, raw.data or b"")
    subject = original.subject or letter.subject
    msg_id = f"replay:{seq}:{uuid.uuid4().hex}"
    headers = {"Nats-Msg-Id": msg_id, "Trainyard-Replay-Of": header_value(f"{STREAM}:{seq}")}
    if actor:
        headers["Trainyard-Replayed-By"] = header_value(actor)
    ack = await bus.publish_raw(subject, original.data or b"", headers)
    sent = bus.message_id(subject, msg_id)
    return Replayed(seq=seq, stream=letter.stream, subject=subject, replayed_seq=ack.seq, msg_id=sent)


async def discard(bus: Bus, seq: int) -> DeadLetter:
    """Remove dead letter ``seq`` from the stream, its message not replayed (the
    original stays in its own stream until that one's retention ends); the dead
    letter as it was.  :class:`DeadLetterNotFound` when there is none."""
    letter = await read(bus, seq)
    try:
        await bus.js.delete_msg(STREAM, seq)
    except nats.js.errors.NotFoundError:
        raise DeadLetterNotFound(f"no dead letter {seq} (it was discarded or aged out meanwhile)") from None
    return letter


async def counts(bus: Bus) -> dict[str, int]:
    """Dead letters in the stream now, per stream they came from (every stream, zero or not)."""
    info = await bus.js.stream_info(STREAM, subjects_filter=subjects.DEADLETTER_ALL)
    out = dict.fromkeys(SOURCES, 0)
    for subject, n in (info.state.subjects or {}).items():
        out[source_stream(subject)] = out.get(source_stream(subject), 0) + n
    return out
