"""Admission's intake against real NATS and Redis: valid submissions become
JobAccepted once, bad ones get a JobRejected that says what to fix, and
messages that cannot be answered go to the dead-letter stream with the reason."""

from __future__ import annotations

import asyncio
import json
import time

import msgspec
import pytest
from nats.aio.msg import Msg

from trainyard.bus import Bus, ConsumerSpec, run_consumer
from trainyard.config.tenancy import compile_tenancy, load_tenancy
from trainyard.domain import JobSpec, NodeInfo, Role
from trainyard.events import (
    CancelJob,
    JobAccepted,
    JobCancelled,
    JobRejected,
    NodeRegistered,
    SubmitJob,
    encode,
    subjects,
)
from trainyard.store import Projector, Store, views
from trainyard.store.fleet import read_fleet
from trainyard.store.projections import RedisProjections
from trainyard.testing.streams import read_job_events, read_raw
from trainyard.testing.waiting import eventually
from trainyard_admission.handlers import IntakeHandler
from trainyard_admission.tenancy import TenancyHolder

SPEC = JobSpec(tenant="acme", queue="q", roles=[Role(name="t", gpus_per_replica=8)], simulated_duration_s=1.0)


async def run_intake(bus: Bus, store: Store, until_jobs_events: int, until_dead: int = 0) -> None:
    """Run admission's intake consumer until the streams hold what we expect."""
    stop = asyncio.Event()
    spec = ConsumerSpec(stream="INTAKE", durable="admission-intake", filter_subject=subjects.INTAKE_ALL)
    task = asyncio.create_task(run_consumer(bus, spec, IntakeHandler(RedisProjections(bus, store), time.time), stop))
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
            encode(
                SubmitJob(
                    at=1.0,
                    spec=JobSpec(tenant="acme", queue="q", roles=[Role(name="t", replicas=0)], image="i"),
                    job_id="bad1",
                )
            ),
            "roles[0].replicas",
            "between 1 and",
            id="an invalid spec is rejected naming the field",
        ),
        pytest.param(
            "globex",
            encode(SubmitJob(at=1.0, spec=SPEC, job_id="bad2")),
            "tenant",
            "was sent to trainyard.intake.globex",
            id="a spec for another tenant sent on this tenant's subject is rejected",
        ),
        pytest.param(
            "acme",
            json.dumps({"type": "SubmitJob", "at": 1, "job_id": "bad3", "spec": {"tenant": "acme"}}).encode(),
            "payload",
            "missing required field",
            id="a malformed command that names its job id is rejected under that id",
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


# --- bad input of every kind, against a running intake ----------------------

TENANCY = """
flavors: [{name: H100, node_pool: h100}]
priority_classes:
  - {name: production, priority: 1000, preemptible: false}
  - {name: standard, priority: 500}
organisations:
  - name: org
    quota: {H100: {nominal: 64}}
    teams:
      - name: acme
        quota: {H100: {nominal: 32}}
        queues: [{name: q, quota: {H100: {nominal: 32}}}]
      - name: globex
        quota: {H100: {nominal: 32}}
        priority_classes: [production, standard]
        queues: [{name: q, quota: {H100: {nominal: 32}}}]
"""


async def fleet_of(store: Store, nodes: int) -> bool:
    return sum((await read_fleet(store)).nodes.values()) == nodes


class Intake:
    """Admission's intake consumer with the JOBS and NODES projections it reads."""

    def __init__(self, bus: Bus, store: Store, tenancy: str | None) -> None:
        self.bus, self.store, self.stop = bus, store, asyncio.Event()
        holder = TenancyHolder()
        if tenancy is not None:
            cfg = load_tenancy(tenancy)
            holder.set(compile_tenancy(cfg), cfg, 1)
        spec = ConsumerSpec(stream="INTAKE", durable="admission-intake", filter_subject=subjects.INTAKE_ALL)
        self.consumer = asyncio.create_task(
            run_consumer(bus, spec, IntakeHandler(RedisProjections(bus, store), time.time, holder), self.stop)
        )
        self.projectors = [asyncio.create_task(Projector(bus, store, s).run(self.stop)) for s in ("JOBS", "NODES")]
        self.sent = 0

    async def send(self, payload: bytes, tenant: str = "acme") -> int:
        self.sent += 1
        ack = await self.bus.publish_raw(f"trainyard.intake.{tenant}", payload, {"Nats-Msg-Id": f"m{self.sent}"})
        return ack.seq

    async def submit(self, spec: JobSpec, job_id: str, tenant: str = "acme") -> int:
        return await self.send(encode(SubmitJob(at=1.0, spec=spec, job_id=job_id)), tenant)

    async def event(self, job_id: str, kinds: tuple[type, ...] = (JobAccepted, JobRejected)) -> object:
        """The first event of ``kinds`` filed for ``job_id``, once there is one."""

        async def found():  # type: ignore[no-untyped-def]
            return [e for e in await read_job_events(self.bus) if e.job_id == job_id and isinstance(e, kinds)]

        return (await eventually(found))[0]

    async def dead_letter(self, intake_seq: int) -> Msg:
        async def found():  # type: ignore[no-untyped-def]
            info = await self.bus.js.stream_info("DEADLETTER")
            for seq in range(info.state.first_seq, info.state.last_seq + 1 if info.state.messages else 0):
                msg = await self.bus.js.get_msg("DEADLETTER", seq)
                if msg.headers and msg.headers.get("Trainyard-Stream-Seq") == str(intake_seq):
                    return msg
            return None

        return await eventually(found)

    async def node(self, node_id: str, gpus: int, gpu_type: str = "H100") -> None:
        info = NodeInfo(node_id=node_id, cluster="c1", gpu_type=gpu_type, gpus=gpus)
        await self.bus.publish(
            subjects.node("c1", node_id), NodeRegistered(at=1.0, node=info, boot_id="b1"), f"reg-{node_id}"
        )

    async def still_serving(self, job_id: str) -> None:
        """A good submission after the bad ones is still accepted, by the same consumer."""
        await self.submit(SPEC, job_id)
        assert isinstance(await self.event(job_id), JobAccepted)
        assert not self.consumer.done() and not any(p.done() for p in self.projectors)

    async def close(self) -> None:
        self.stop.set()
        await asyncio.gather(self.consumer, *self.projectors)


@pytest.fixture
async def intake(bus: Bus, store: Store):  # type: ignore[no-untyped-def]
    running = Intake(bus, store, TENANCY)
    yield running
    await running.close()


def submit_json(job_id: str, spec: object, **extra: object) -> bytes:
    return json.dumps({"type": "SubmitJob", "at": 1, "job_id": job_id, "spec": spec, **extra}).encode()


GOOD = json.loads(encode(SPEC))


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        pytest.param(
            submit_json("big", {**GOOD, "name": "n" * 1_000_000}),
            "intake takes at most 262144",
            id="a submission of nearly 1 MiB is dead-lettered as too large",
        ),
        pytest.param(
            b'{"type":"SubmitJob","at":1,"job_id":"deep","x":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
            "nested too deeply",
            id="a deeply nested field that is not even in the schema",
        ),
        pytest.param(
            b'{"type":"SubmitJob","at":1,"x":' + b'{"a":' * 30_000 + b"1" + b"}" * 30_000 + b"}",
            "nested too deeply",
            id="JSON nested too deeply for the decoder",
        ),
        pytest.param(b"\xff\xfe\x00garbage", "no job_id to reject it under", id="bytes that are not JSON"),
        pytest.param(submit_json("a" * 65, GOOD), "(65 characters)", id="a 65-character job id"),
        pytest.param(submit_json("j-1\n", GOOD), "not a job id", id="a job id ending in a newline"),
        pytest.param(submit_json("", GOOD), "not a job id", id="an empty job id"),
        pytest.param(
            json.dumps({"type": "SubmitJob", "at": 1, "job_id": "a" * 65, "spec": 7}).encode(),
            "(65 characters)",
            id="a malformed command naming a 65-character id cannot be rejected under it",
        ),
    ],
)
async def test_messages_that_cannot_be_answered_are_dead_lettered_with_a_reason_and_intake_keeps_serving(
    intake: Intake, payload: bytes, words: str
) -> None:
    seq = await intake.send(payload)
    dead = await intake.dead_letter(seq)
    assert words in dead.headers["Trainyard-Reason"], dead.headers
    assert dead.headers["Trainyard-Size"] == str(len(payload))
    assert dead.data == payload[: 64 * 1024]
    await intake.still_serving("after")
    assert [e.job_id for e in await read_job_events(intake.bus)] == ["after"]  # nothing filed for the bad one
    assert intake.bus.nc.stats["reconnects"] == 0


async def test_a_bad_subject_is_dead_lettered(intake: Intake) -> None:
    seq = await intake.send(encode(SubmitJob(at=1.0, spec=SPEC, job_id="sub")), tenant="acme.extra")
    assert "not an intake subject" in (await intake.dead_letter(seq)).headers["Trainyard-Reason"]
    await intake.still_serving("after")


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        pytest.param(
            {**GOOD, "name": "n" * 100_000},
            "spec",
            "at most 65536",
            id="a spec over 64 KiB is rejected, not dead-lettered",
        ),
        pytest.param({**GOOD, "roles": "trainer"}, "payload", "Expected `array`", id="a field of the wrong type"),
        pytest.param({**GOOD, "labels": {"team": "a\u0000b"}}, "labels.team", "U+0000", id="a NUL in a label value"),
        pytest.param({**GOOD, "image": "reg/t:1\n"}, "image", "U+000A", id="an image ending in a newline"),
    ],
)
async def test_bad_specs_are_rejected_under_their_job_id(intake: Intake, spec: dict, field: str, words: str) -> None:
    await intake.send(submit_json("bad", spec))
    event = await intake.event("bad")
    assert isinstance(event, JobRejected)
    assert any(e.field == field and words in e.message for e in event.errors), event.errors
    assert all(len(e.message) <= 1000 for e in event.errors)
    await intake.still_serving("after")


async def test_a_priority_class_the_queue_is_not_granted_is_rejected_naming_the_allowed_ones(intake: Intake) -> None:
    await intake.submit(msgspec.structs.replace(SPEC, priority_class="production"), "prod")
    event = await intake.event("prod")
    assert isinstance(event, JobRejected)
    [error] = event.errors
    assert error.field == "priority_class"
    assert error.message == "queue acme/q may not use priority class 'production'; it may use: standard"
    granted = JobSpec(
        tenant="globex", queue="q", priority_class="production", roles=SPEC.roles, simulated_duration_s=1.0
    )
    await intake.submit(granted, "granted", tenant="globex")
    assert isinstance(await intake.event("granted"), JobAccepted)


@pytest.mark.parametrize(
    ("roles", "field", "words"),
    [
        pytest.param(
            [Role(name="t", gpus_per_replica=16)],
            "roles[0].gpus_per_replica",
            "the largest H100 node has 8",
            id="a replica larger than the largest node",
        ),
        pytest.param(
            [Role(name="t", replicas=3, gpus_per_replica=8)],
            "roles",
            "the whole fleet has 16 (2 nodes)",
            id="a gang larger than the fleet",
        ),
    ],
)
async def test_a_job_that_can_never_fit_the_registered_fleet_is_rejected(
    intake: Intake, roles: list[Role], field: str, words: str
) -> None:
    await intake.node("n1", 8)
    await intake.node("n2", 8)
    await eventually(lambda: fleet_of(intake.store, 2))  # a fleet view that lags only ever accepts
    await intake.submit(msgspec.structs.replace(SPEC, roles=roles), "huge")
    event = await intake.event("huge")
    assert isinstance(event, JobRejected)
    assert any(e.field == field and words in e.message for e in event.errors), event.errors
    # A node registered later counts at once: the same gang now fits.
    await intake.node("n3", 8)
    await intake.submit(msgspec.structs.replace(SPEC, roles=[Role(name="t", replicas=3, gpus_per_replica=8)]), "fits")
    assert isinstance(await intake.event("fits"), JobAccepted)


@pytest.mark.parametrize(
    ("subject_tenant", "body_tenant", "words"),
    [
        pytest.param(
            "globex", "globex", "does not belong to tenant globex", id="another tenant cancels on its own subject"
        ),
        pytest.param(
            "globex",
            "acme",
            "names tenant 'acme' but was sent for tenant 'globex'",
            id="another tenant cancels naming the owner in the body",
        ),
    ],
)
async def test_a_cancel_from_another_tenant_is_refused_and_the_job_goes_on(
    intake: Intake, subject_tenant: str, body_tenant: str, words: str
) -> None:
    await intake.submit(SPEC, "mine")
    assert isinstance(await intake.event("mine"), JobAccepted)
    await eventually(lambda: views.get_job(intake.store, "mine"))
    seq = await intake.send(encode(CancelJob(at=2.0, job_id="mine", tenant=body_tenant)), tenant=subject_tenant)
    assert words in (await intake.dead_letter(seq)).headers["Trainyard-Reason"]
    assert (await views.get_job(intake.store, "mine")).status == "pending"
    # The owner may cancel it.
    await intake.send(encode(CancelJob(at=3.0, job_id="mine", tenant="acme")), tenant="acme")
    assert isinstance(await intake.event("mine", (JobCancelled,)), JobCancelled)


async def test_a_cancel_with_a_huge_reason_is_dead_lettered(intake: Intake) -> None:
    seq = await intake.send(encode(CancelJob(at=2.0, job_id="j-1", tenant="acme", reason="r" * 100_000)))
    assert "reason: at most 1024 characters" in (await intake.dead_letter(seq)).headers["Trainyard-Reason"]
