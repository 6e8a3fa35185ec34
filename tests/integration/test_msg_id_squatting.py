"""Message-id squatting on the locked bus: JetStream drops a message whose
``Nats-Msg-Id`` it stored in the duplicate window, whoever sent the first and
on whatever subject.  Each attack here is made with the attacker's real
credential, with the id the victim is known to use; the victim's message must
still be stored (see ``Bus.message_id``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.js.api import PubAck

from trainyard.bus import Bus
from trainyard.bus.connection import logical_id
from trainyard.domain.job import JobSpec, Role
from trainyard.events import encode, subjects
from trainyard.events.jobs import CancelJob, JobAccepted, SubmitJob
from trainyard.testing.locked_bus import Connect, locked_bus

BETA = JobSpec(tenant="beta", queue="q", roles=[Role(name="t", gpus_per_replica=8)], simulated_duration_s=1.0)
ACME = JobSpec(tenant="acme", queue="q", roles=[Role(name="t", gpus_per_replica=8)], simulated_duration_s=1.0)


@pytest.fixture
async def connect(tmp_path: Path) -> AsyncIterator[Connect]:
    async with locked_bus(tmp_path) as (as_user, _):
        yield as_user


async def squat(bus: Bus, subject: str, data: bytes, msg_id: str) -> PubAck:
    """Publish with ``msg_id`` exactly as given, as a hostile client would
    (the stock client, no tag)."""
    return await bus.js.publish(subject, data, headers={"Nats-Msg-Id": msg_id})


async def stored_as_sent(admin: Bus, stream: str, ack: PubAck, subject: str, data: bytes) -> bool:
    msg = await admin.js.get_msg(stream, ack.seq)
    return msg.subject == subject and msg.data == data


@pytest.mark.parametrize(
    ("victim_id", "victim_command"),
    [
        pytest.param(
            "submit:beta:j-9",
            SubmitJob(at=2.0, spec=BETA, job_id="j-9"),
            id="acme's portal takes beta's submission id first: beta's submission is still stored",
        ),
        pytest.param(
            "cancel:j-9",
            CancelJob(at=2.0, job_id="j-9", tenant="beta", reason="cancelled by user"),
            id="acme's portal takes the id of beta's cancel first: beta's cancel is still stored",
        ),
    ],
)
async def test_a_portal_cannot_drop_another_tenants_intake_command_by_taking_its_id_first(
    connect: Connect, victim_id: str, victim_command: SubmitJob | CancelJob
) -> None:
    portal, gateway = await connect("portal-acme"), await connect("gateway")
    harmless = SubmitJob(at=1.0, spec=ACME, job_id="a-1")
    taken = await squat(portal, subjects.intake("acme"), encode(harmless), victim_id)
    assert not taken.duplicate  # the attacker's message is stored under the victim's id as it is

    # The gateway publishes beta's command with the id it always uses (trainyard_gateway.jobs).
    ack = await gateway.publish(subjects.intake("beta"), victim_command, msg_id=victim_id)

    assert not ack.duplicate and ack.seq != taken.seq
    admin = await connect("admin")
    assert await stored_as_sent(admin, "INTAKE", ack, subjects.intake("beta"), encode(victim_command))
    stored = await admin.js.get_msg("INTAKE", ack.seq)
    assert stored.headers is not None and logical_id(stored.headers["Nats-Msg-Id"]) == victim_id


async def test_a_node_agent_cannot_drop_admissions_acceptance_by_taking_its_id_first(connect: Connect) -> None:
    agent, admission = await connect("emulator"), await connect("admission")
    taken = await squat(agent, subjects.job("acme", "a-1", "agent"), b'{"type": "RunStarted"}', "beta/j-9:accepted")
    assert not taken.duplicate

    # Admission accepts beta's job as its handler does: fenced on the job id anywhere.
    accepted = JobAccepted(at=2.0, job_id="j-9", spec=BETA, submitted_at=1.0)
    subject = subjects.job("beta", "j-9", "admission")
    ack = await admission.publish(
        subject,
        accepted,
        "beta/j-9:accepted",
        expected_last_subject_seq=0,
        fence_subject=subjects.job_id_anywhere("j-9"),
    )

    assert not ack.duplicate and ack.seq != taken.seq
    assert await stored_as_sent(await connect("admin"), "JOBS", ack, subject, encode(accepted))


async def test_the_same_credential_still_deduplicates_its_own_retries(connect: Connect) -> None:
    """Every replica of a service shares its user: a retried publish, from
    the same process or another replica, is one message; the same id on
    another subject is another message."""
    first, replica = await connect("gateway"), await connect("gateway")
    command = SubmitJob(at=1.0, spec=BETA, job_id="j-1")
    stored = await first.publish(subjects.intake("beta"), command, msg_id="submit:beta:j-1")
    again = await replica.publish(subjects.intake("beta"), command, msg_id="submit:beta:j-1")
    elsewhere = await first.publish(subjects.intake("acme"), command, msg_id="submit:beta:j-1")
    assert again.duplicate and again.seq == stored.seq
    assert not elsewhere.duplicate and elsewhere.seq != stored.seq


async def test_a_dead_letter_cannot_be_dropped_by_another_writer_of_dead_letters(connect: Connect) -> None:
    """Health may write dead letters too: it cannot take the id of the dead
    letter accounting is about to write for JOBS message 7."""
    health, accounting = await connect("health"), await connect("accounting")
    taken = await squat(health, subjects.deadletter("NODES"), b"decoy", "dlq:JOBS:7")
    ack = await accounting.publish_raw(subjects.deadletter("JOBS"), b"lost", {"Nats-Msg-Id": "dlq:JOBS:7"})
    assert not ack.duplicate and ack.seq != taken.seq
