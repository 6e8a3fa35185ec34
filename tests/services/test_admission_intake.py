"""Admission's intake against real NATS and Redis: valid submissions become
JobAccepted once, bad ones get a JobRejected that says what to fix, and
messages that cannot be answered go to the dead-letter stream with the reason."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from trainyard.bus import Bus, ConsumerSpec, run_consumer
from trainyard.domain import JobSpec, Role
from trainyard.events import JobAccepted, JobRejected, SubmitJob, encode, subjects
from trainyard.store import Store
from trainyard.testing.streams import read_job_events, read_raw
from trainyard_admission.handlers import IntakeHandler

SPEC = JobSpec(tenant="acme", queue="q", roles=[Role(name="t", gpus_per_replica=8)], simulated_duration_s=1.0)


async def run_intake(bus: Bus, store: Store, until_jobs_events: int, until_dead: int = 0) -> None:
    """Run admission's intake consumer until the streams hold what we expect."""
    stop = asyncio.Event()
    spec = ConsumerSpec(stream="INTAKE", durable="admission-intake", filter_subject=subjects.INTAKE_ALL)
    task = asyncio.create_task(run_consumer(bus, spec, IntakeHandler(bus, store, time.time), stop))
    try:
        for _ in range(200):
            jobs = (await bus.js.stream_info("JOBS")).state.messages
            dead = (await bus.js.stream_info("DEADLETTER")).state.messages
            if jobs >= until_jobs_events and dead >= until_dead:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # anything more would show up now
    finally:
        stop.set()
        await task


async def test_a_submission_sent_twice_is_accepted_once(bus: Bus, store: Store) -> None:
    for i in range(2):
        cmd = SubmitJob(at=1.0, spec=SPEC, job_id="j1")
        await bus.publish(subjects.intake("acme"), cmd, msg_id=f"retry-{i}")  # different message ids
    await run_intake(bus, store, until_jobs_events=1)
    events = await read_job_events(bus)
    assert [type(e).__name__ for e in events] == ["JobAccepted"]
    assert isinstance(events[0], JobAccepted) and events[0].job_id == "j1" and events[0].spec == SPEC


async def test_a_submission_without_an_id_gets_one_from_the_intake_sequence(bus: Bus, store: Store) -> None:
    await bus.publish(subjects.intake("acme"), SubmitJob(at=1.0, spec=SPEC), msg_id="a")
    await run_intake(bus, store, until_jobs_events=1)
    [event] = await read_job_events(bus)
    assert isinstance(event, JobAccepted) and event.job_id == "j1"


@pytest.mark.parametrize(
    ("subject_tenant", "payload", "field", "words"),
    [
        pytest.param(
            "acme",
            encode(SubmitJob(at=1.0, spec=JobSpec(tenant="acme", queue="q", roles=[Role(name="t", replicas=0)], image="i"),
                             job_id="bad1")),
            "roles[0].replicas", "between 1 and", id="an invalid spec is rejected naming the field",
        ),
        pytest.param(
            "globex", encode(SubmitJob(at=1.0, spec=SPEC, job_id="bad2")), "tenant", "was sent to trainyard.intake.globex",
            id="a spec for another tenant sent on this tenant's subject is rejected",
        ),
        pytest.param(
            "acme", json.dumps({"type": "SubmitJob", "at": 1, "job_id": "bad3", "spec": {"tenant": "acme"}}).encode(),
            "payload", "missing required field", id="a malformed command that names its job id is rejected under that id",
        ),
    ],
)
async def test_bad_input_is_rejected_with_a_reason_and_nothing_else_happens(
    bus: Bus, store: Store, subject_tenant: str, payload: bytes, field: str, words: str
) -> None:
    await bus.js.publish(subjects.intake(subject_tenant), payload, headers={"Nats-Msg-Id": "m1"})
    await run_intake(bus, store, until_jobs_events=1)
    [event] = await read_job_events(bus)
    assert isinstance(event, JobRejected)
    assert any(e.field == field and words in e.message for e in event.errors), event.errors


async def test_a_message_that_cannot_be_answered_is_dead_lettered_with_the_reason(bus: Bus, store: Store) -> None:
    await bus.js.publish(subjects.intake("acme"), b"\x00 not json", headers={"Nats-Msg-Id": "junk"})
    await bus.publish(subjects.intake("acme"), SubmitJob(at=1.0, spec=SPEC, job_id="ok"), msg_id="ok")
    await run_intake(bus, store, until_jobs_events=1, until_dead=1)
    [(_, subject, data)] = await read_raw(bus, "DEADLETTER")
    assert subject == "trainyard.deadletter.intake" and data == b"\x00 not json"
    msg = await bus.js.get_last_msg("DEADLETTER", subject)
    assert "no job_id to reject it under" in msg.headers["Trainyard-Reason"]
    # The poison message did not hold up the good one behind it.
    assert [e.job_id for e in await read_job_events(bus)] == ["ok"]
