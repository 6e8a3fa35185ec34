"""The fake bus is the real one: every case here runs on
``trainyard.testing.fakes.FakeBus`` and on a real nats-server, through the
same consumer code (``trainyard.bus.consumer``).  What a fast test on the
fake relies on is a line here."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from trainyard.bus import Bus, ConsumerSpec, Delivery, JobEvents, Outcome, PublishRequest, WrongLastSequence
from trainyard.bus.consumer import DEAD_LETTER_KEEP_BYTES, Broker, Puller, consume
from trainyard.domain import JobSpec, Role
from trainyard.events import JobAccepted, JobCancelled, JobEvent, RunSucceeded, encode, subjects
from trainyard.testing.fakes import FakeBus, Scripted, Stored

SUBJECT = subjects.intake("acme")
JOB = subjects.job("acme", "j1", "admission")
SPEC = JobSpec(tenant="acme", queue="q", roles=[Role(name="t", gpus_per_replica=8)])


def accepted(job_id: str = "j1") -> JobAccepted:
    return JobAccepted(at=1.0, job_id=job_id, spec=SPEC, submitted_at=0.5)


def cancelled(job_id: str = "j1") -> JobCancelled:
    return JobCancelled(at=2.0, job_id=job_id, tenant="acme", reason="not needed")


def intake(**settings: Any) -> ConsumerSpec:
    return ConsumerSpec(stream="INTAKE", durable="contract", filter_subject=subjects.INTAKE_ALL, **settings)


@pytest.fixture(params=["fake", "nats-server"])
def broker(request: pytest.FixtureRequest) -> Broker:
    if request.param == "fake":
        return FakeBus()
    bus: Bus = request.getfixturevalue("bus")
    return bus


async def stream(broker: Broker, name: str) -> list[Stored]:
    """What stream ``name`` holds, in order, read the way each side can."""
    if isinstance(broker, FakeBus):
        return broker.messages(name)
    assert isinstance(broker, Bus)
    info = await broker.js.stream_info(name)
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1 if info.state.messages else 0):
        raw = await broker.js.get_msg(name, seq)
        out.append(Stored(seq, raw.subject or "", raw.data or b"", dict(raw.headers or {}), 0.0))
    return out


async def fetch(puller: Puller, count: int = 1) -> list[Any]:
    """The next ``count`` messages (a real fetch may return those ready so far,
    or time out early on a busy machine: fetch again, up to 15 s in all)."""
    msgs: list[Any] = []
    for _ in range(3):
        try:
            msgs += await puller.fetch(count - len(msgs), timeout=5.0)
        except TimeoutError:  # nats.errors.TimeoutError, or asyncio's from inside the client
            continue
        if len(msgs) >= count:
            return msgs
    raise AssertionError(f"{len(msgs)} of {count} messages delivered within 15 s")


async def nothing_within(puller: Puller, seconds: float) -> bool:
    try:
        await puller.fetch(10, timeout=seconds)
    except TimeoutError:  # nats.errors.TimeoutError, or asyncio's from inside the client
        return True
    return False


# --- publishing -------------------------------------------------------------


async def test_a_repeated_message_id_is_stored_once(broker: Broker) -> None:
    first = await broker.publish(SUBJECT, {"n": 1}, msg_id="m1")
    again = await broker.publish(SUBJECT, {"n": 2}, msg_id="m1")
    other = await broker.publish(SUBJECT, {"n": 3}, msg_id="m2")

    assert not first.duplicate and again.duplicate and again.seq == first.seq
    assert other.seq == first.seq + 1 and not other.duplicate
    assert [m.data for m in await stream(broker, "INTAKE")] == [encode({"n": 1}), encode({"n": 3})]


async def test_a_fenced_publish_is_refused_once_its_subjects_moved_on(broker: Broker) -> None:
    anywhere = subjects.job_id_anywhere("j1")
    first = await broker.publish(JOB, accepted(), "a", expected_last_subject_seq=0, fence_subject=anywhere)
    with pytest.raises(WrongLastSequence):  # the same job id under another tenant
        await broker.publish(subjects.job("beta", "j1", "admission"), accepted(), "b", 0, fence_subject=anywhere)
    with pytest.raises(WrongLastSequence):  # the job's history (the default fence of a job subject)
        await broker.publish(subjects.job("acme", "j1", "agent"), cancelled(), "c", expected_last_subject_seq=0)
    then = await broker.publish(
        subjects.job("acme", "j1", "agent"), cancelled(), "d", expected_last_subject_seq=first.seq
    )
    other = await broker.publish(
        subjects.job("acme", "j2", "admission"), accepted("j2"), "e", expected_last_subject_seq=0
    )

    assert [m.seq for m in await stream(broker, "JOBS")] == [first.seq, then.seq, other.seq] == [1, 2, 3]


async def test_the_fence_is_checked_before_the_message_id(broker: Broker) -> None:
    """A repeat of a fenced publish is refused, not a duplicate: whoever
    fences must recognise its own earlier write when refused."""
    first = await broker.publish(JOB, accepted(), "a", expected_last_subject_seq=0)
    with pytest.raises(WrongLastSequence):
        await broker.publish(JOB, accepted(), "a", expected_last_subject_seq=0)
    again = await broker.publish(JOB, accepted(), "a", expected_last_subject_seq=first.seq)

    assert again.duplicate and again.seq == first.seq


# --- delivery -----------------------------------------------------------------


async def test_a_consumer_gets_its_subjects_in_stream_order_once_each(broker: Broker) -> None:
    for i in range(5):
        await broker.publish(subjects.intake("acme" if i % 2 == 0 else "beta"), {"n": i}, msg_id=f"m{i}")
    puller = await broker.pull(
        ConsumerSpec(stream="INTAKE", durable="acme-only", filter_subject=subjects.intake("acme"))
    )

    msgs = await fetch(puller, 3)

    assert [(m.metadata.sequence.stream, m.metadata.num_delivered) for m in msgs] == [(1, 1), (3, 1), (5, 1)]
    assert [m.data for m in msgs] == [encode({"n": i}) for i in (0, 2, 4)]
    assert await nothing_within(puller, 0.3)


async def test_a_fetch_without_waiting_takes_what_is_stored_up_to_the_batch(broker: Broker) -> None:
    puller = await broker.pull(intake())
    with pytest.raises(TimeoutError):  # nothing stored: no waiting for the first to come
        await puller.fetch(10, timeout=0)
    for i in range(5):
        await broker.publish(SUBJECT, {"n": i}, msg_id=f"m{i}")

    first = await puller.fetch(3, timeout=0)
    rest = await puller.fetch(10, timeout=0)

    assert [m.data for m in first] == [encode({"n": i}) for i in range(3)]
    assert [m.data for m in rest] == [encode({"n": i}) for i in (3, 4)]


async def test_an_acked_message_is_gone_and_an_unsettled_one_comes_back_after_ack_wait(broker: Broker) -> None:
    for i in range(2):
        await broker.publish(SUBJECT, {"n": i}, msg_id=f"m{i}")
    puller = await broker.pull(intake(ack_wait_s=0.5))
    first, _ = await fetch(puller, 2)
    await first.ack()

    [again] = await fetch(puller)

    assert again.metadata.sequence.stream == 2 and again.metadata.num_delivered == 2
    await again.ack()
    assert await nothing_within(puller, 1.0)


async def test_a_nak_delivers_the_message_again_after_its_delay(broker: Broker) -> None:
    await broker.publish(SUBJECT, {"n": 1}, msg_id="m1")
    puller = await broker.pull(intake())
    [msg] = await fetch(puller)
    await msg.nak(delay=0.5)

    assert await nothing_within(puller, 0.2)
    [again] = await fetch(puller)
    assert again.metadata.sequence.stream == 1 and again.metadata.num_delivered == 2


async def test_a_terminated_message_is_never_delivered_again(broker: Broker) -> None:
    await broker.publish(SUBJECT, {"n": 1}, msg_id="m1")
    puller = await broker.pull(intake(ack_wait_s=0.5))
    [msg] = await fetch(puller)
    await msg.term()

    assert await nothing_within(puller, 1.0)


# --- the consumer loop on each --------------------------------------------------


async def test_poison_is_dead_lettered_with_its_reason_and_the_rest_is_acked(broker: Broker) -> None:
    for data in (b"good", b"bad", b"x" * (DEAD_LETTER_KEEP_BYTES + 10)):
        await broker.publish_raw(SUBJECT, data, {"Nats-Msg-Id": data[:8].decode()})
    spec = intake(ack_wait_s=0.5)
    puller = await broker.pull(spec)
    handler = Scripted(
        lambda d: Outcome.poison(f"{len(d.event)} bytes of nonsense") if d.event != b"good" else Outcome.done()
    )

    fates = await consume(broker, spec, handler, await fetch(puller, 3))

    assert fates == ["ack", "dead-letter", "dead-letter"]
    small, big = await stream(broker, "DEADLETTER")
    assert small.subject == subjects.deadletter("INTAKE") and small.data == b"bad"
    assert small.headers["Trainyard-Reason"] == "3 bytes of nonsense"
    assert small.headers["Trainyard-Subject"] == SUBJECT and small.headers["Trainyard-Stream-Seq"] == "2"
    assert small.headers["Trainyard-Size"] == "3" and "Trainyard-Truncated" not in small.headers
    assert big.data == b"x" * DEAD_LETTER_KEEP_BYTES and big.headers["Trainyard-Size"] == str(
        DEAD_LETTER_KEEP_BYTES + 10
    )
    assert (
        big.headers["Trainyard-Truncated"]
        == f"kept the first {DEAD_LETTER_KEEP_BYTES} of {DEAD_LETTER_KEEP_BYTES + 10} bytes"
    )
    assert await nothing_within(puller, 1.0)


class Jobs(JobEvents):
    """A JOBS subscription that keeps what it was given."""

    def __init__(self) -> None:
        self.seen: list[Delivery[JobEvent]] = []

    async def handle(self, batch: Sequence[Delivery[JobEvent]]) -> list[Outcome]:
        self.seen.extend(batch)
        return [Outcome.done()] * len(batch)


async def test_what_does_not_decode_or_disagrees_with_its_subject_never_reaches_the_handler(broker: Broker) -> None:
    await broker.publish_raw(JOB, b'{"type": "Nonsense"}', {"Nats-Msg-Id": "junk"})
    forged = RunSucceeded(at=9.0, job_id="j1", tenant="acme", run_id="r1")
    await broker.publish(subjects.job("acme", "j1", "admission"), forged, msg_id="forged")  # admission ends no run well
    await broker.publish(JOB, accepted(), msg_id="good")
    spec = ConsumerSpec(stream="JOBS", durable="jobs", filter_subject=subjects.JOBS_ALL)
    handler = Jobs()

    fates = await consume(broker, spec, handler, await fetch(await broker.pull(spec), 3))

    assert fates == ["dead-letter", "dead-letter", "ack"]
    assert [(d.seq, d.subject, d.event) for d in handler.seen] == [(3, JOB, accepted())]
    junk, wrong = [m.headers["Trainyard-Reason"] for m in await stream(broker, "DEADLETTER")]
    assert junk.startswith("not a job event") and "may not be written by 'admission'" in wrong


async def test_a_failing_message_is_retried_until_max_deliver_then_dead_lettered(broker: Broker) -> None:
    await broker.publish(SUBJECT, {"n": 1}, msg_id="m1")
    spec = intake(max_deliver=2, retry_delay_s=0.1)
    puller = await broker.pull(spec)
    handler = Scripted(lambda _: Outcome.failed(ConnectionError("Redis is not answering")))

    assert await consume(broker, spec, handler, await fetch(puller)) == ["retry"]
    assert await consume(broker, spec, handler, await fetch(puller)) == ["dead-letter"]
    [dead] = await stream(broker, "DEADLETTER")
    assert dead.headers["Trainyard-Reason"].startswith("gave up after 2 deliveries: ConnectionError(")


class Deciding(Scripted):
    """Answers every command with JobAccepted for j1 (fenced at 0 on the job
    id, or not fenced); the first time its publish is stored, crashes before
    the message is acked."""

    def __init__(self, fenced: bool) -> None:
        fence = (0, subjects.job_id_anywhere("j1")) if fenced else (None, None)
        decision = PublishRequest(JOB, accepted(), "acme/j1:accepted", *fence)
        super().__init__(lambda _: Outcome.done(decision))
        self.stored: list[bool] = []  # per stored publish: whether the stream had it already
        self.refusals: list[PublishRequest] = []

    def published(self, delivery: Delivery[bytes], request: PublishRequest, ack: Any) -> None:
        self.stored.append(bool(ack.duplicate))
        if len(self.stored) == 1:
            raise ConnectionError("crashed between the publish and the ack")

    async def refused(self, delivery: Delivery[bytes], request: PublishRequest) -> Outcome:
        self.refusals.append(request)
        return Outcome.poison("j1 belongs to someone else")


async def test_events_a_handler_returns_are_published_once_though_its_batch_comes_again(broker: Broker) -> None:
    await broker.publish(SUBJECT, {"submit": "j1"}, msg_id="m1")
    spec = intake(retry_delay_s=0.1)
    puller = await broker.pull(spec)
    handler = Deciding(fenced=False)

    assert await consume(broker, spec, handler, await fetch(puller)) == ["retry"]
    assert await consume(broker, spec, handler, await fetch(puller)) == ["ack"]

    assert [d.delivered for d in handler.seen] == [1, 2] and handler.stored == [False, True]
    assert [m.data for m in await stream(broker, "JOBS")] == [encode(accepted())]
    assert handler.refusals == [] and await stream(broker, "DEADLETTER") == []


async def test_a_publish_refused_by_its_fence_is_settled_as_the_subscription_says(broker: Broker) -> None:
    await broker.publish(subjects.job("beta", "j1", "admission"), accepted(), msg_id="theirs")
    await broker.publish(SUBJECT, {"submit": "j1"}, msg_id="m1")
    spec = intake()
    handler = Deciding(fenced=True)

    fates = await consume(broker, spec, handler, await fetch(await broker.pull(spec)))

    assert fates == ["dead-letter"] and handler.stored == []
    assert [r.msg_id for r in handler.refusals] == ["acme/j1:accepted"]
    [dead] = await stream(broker, "DEADLETTER")
    assert dead.headers["Trainyard-Reason"] == "j1 belongs to someone else"
    assert len(await stream(broker, "JOBS")) == 1
