"""Group commit against a real nats-server: publishes that wait together go
out as atomic batches, and every caller gets the answer it would have had
alone: its own sequence, a duplicate's first acknowledgement, its own fence
refusal, its own error; nothing is stored twice or lost."""

from __future__ import annotations

import asyncio

from nats.js.api import PubAck

from trainyard.bus import Bus, WrongLastSequence
from trainyard.bus.streams import STREAMS, ensure_streams, stream_config
from trainyard.events import JobCancelled, job_subject
from trainyard.local.servers import Server
from trainyard.settings import load_settings


def cancelled(n: int) -> JobCancelled:
    return JobCancelled(at=1.0, job_id=f"job-{n:05d}", tenant="acme", reason="test")


async def publish(bus: Bus, n: int, msg_id: str | None = None) -> PubAck:
    event = cancelled(n)
    return await bus.publish(job_subject(event), event, msg_id or f"cancel:{n}")


async def stored(bus: Bus, seq: int) -> tuple[str, str]:
    """The subject and message id the stream holds at ``seq``."""
    msg = await bus.js.get_msg("JOBS", seq)
    return msg.subject, (msg.headers or {})["Nats-Msg-Id"]


async def test_publishes_in_flight_together_share_batches_and_each_gets_its_own_sequence(bus: Bus) -> None:
    assert bus.group_commit is not None
    acks = await asyncio.gather(*(publish(bus, n) for n in range(300)))
    assert sorted(a.seq for a in acks) == list(range(1, 301))
    assert bus.group_commit.batches > 0 and bus.group_commit.batched_messages > 1
    for n in (0, 137, 299):  # each ack points at that caller's own message
        assert await stored(bus, acks[n].seq) == (job_subject(cancelled(n)), f"cancel:{n}")
    info = await bus.js.stream_info("JOBS")
    assert info.state.messages == 300


async def test_a_duplicate_in_a_batch_gets_its_first_ack_and_the_rest_are_stored_once(bus: Bus) -> None:
    first = await publish(bus, 97)  # the end of the next group: it waits for a batch
    acks = await asyncio.gather(*(publish(bus, n) for n in range(100)))
    assert acks[97].seq == first.seq and acks[97].duplicate
    assert sum(1 for a in acks if a.duplicate) == 1
    info = await bus.js.stream_info("JOBS")
    assert info.state.messages == 100
    assert bus.group_commit is not None and bus.group_commit.fallbacks >= 1


async def test_a_stale_fence_fails_only_its_own_publish(bus: Bus) -> None:
    seed = [await publish(bus, n) for n in range(3)]
    assert [a.seq for a in seed] == [1, 2, 3]
    event = cancelled(1)

    async def fenced(expected: int) -> PubAck:
        return await bus.publish(job_subject(event), event, f"fenced:{expected}", expected_last_subject_seq=expected)

    results = await asyncio.gather(
        *(publish(bus, n) for n in range(10, 60)),
        fenced(0),  # job-00001's history already holds seq 2: stale; last, so it waits for a batch
        return_exceptions=True,
    )
    assert isinstance(results[-1], WrongLastSequence)
    assert all(isinstance(r, PubAck) and not r.duplicate for r in results[:-1])
    assert bus.group_commit is not None and bus.group_commit.fallbacks >= 1
    info = await bus.js.stream_info("JOBS")
    assert info.state.messages == 3 + 50


async def test_a_stream_that_refuses_atomic_batches_gets_every_message_one_by_one(bus: Bus) -> None:
    jobs = next(s for s in STREAMS if s.name == "JOBS")
    config = stream_config(jobs)
    config.allow_atomic = False
    await bus.js.update_stream(config)
    acks = await asyncio.gather(*(publish(bus, n) for n in range(80)))
    assert sorted(a.seq for a in acks) == list(range(1, 81))
    assert bus.group_commit is not None and not bus.group_commit.enabled("JOBS")
    assert bus.group_commit.batches == 0


async def test_a_caller_that_gives_up_does_not_take_the_others_with_it(bus: Bus) -> None:
    tasks = [asyncio.ensure_future(publish(bus, n)) for n in range(60)]
    await asyncio.sleep(0)  # every publish is waiting in the group
    tasks[50].cancel()  # one that waits for a batch
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(results[50], asyncio.CancelledError)
    others = [r for i, r in enumerate(results) if i != 50]
    assert all(isinstance(r, PubAck) for r in others)
    assert len({r.seq for r in others if isinstance(r, PubAck)}) == 59


async def test_group_commit_can_be_turned_off(nats_server: Server) -> None:
    settings = load_settings({"TRAINYARD_NATS_GROUP_COMMIT": "0"})
    off = await Bus.connect(nats_server.url, name="trainyard-test-off", group_commit=settings.nats_group_commit)
    try:
        await ensure_streams(off.js)
        acks = await asyncio.gather(*(publish(off, n) for n in range(20)))
        assert off.group_commit is None
        assert sorted(a.seq for a in acks) == list(range(1, 21))
    finally:
        await off.close()
