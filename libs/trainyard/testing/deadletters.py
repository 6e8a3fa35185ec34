"""Dead letters for tests: a copy of a message a stream holds, written as a
consumer that gave up on it writes one (see trainyard.bus.consumer.dead_letter)."""

from __future__ import annotations

from trainyard.bus import Bus
from trainyard.events import subjects


async def give_up_on(bus: Bus, stream: str, seq: int, reason: str) -> int:
    """Dead-letter message ``seq`` of ``stream`` with ``reason``; the dead letter's sequence."""
    original = await bus.js.get_msg(stream, seq)
    headers = {
        "Trainyard-Reason": reason,
        "Trainyard-Subject": original.subject or "",
        "Trainyard-Stream-Seq": str(seq),
        "Trainyard-Size": str(len(original.data or b"")),
    }
    return (await bus.publish_raw(subjects.deadletter(stream), original.data or b"", headers)).seq
