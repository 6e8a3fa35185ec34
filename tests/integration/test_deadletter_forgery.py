"""Dead letters planted by a service that may write them: replay publishes
only the original message, on the subject its stream stored it on, and
refuses with the reason a dead letter that says otherwise."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from trainyard.bus import Bus, deadletters
from trainyard.domain.job import JobSpec, Role
from trainyard.events import encode, subjects
from trainyard.events.jobs import SubmitJob
from trainyard.testing.locked_bus import Connect, locked_bus

BETA = SubmitJob(
    at=1.0,
    job_id="planted",
    spec=JobSpec(tenant="beta", queue="q", roles=[Role(name="t", gpus_per_replica=8)], simulated_duration_s=1.0),
)


@pytest.fixture
async def connect(tmp_path: Path) -> AsyncIterator[Connect]:
    async with locked_bus(tmp_path) as (as_user, _):
        yield as_user


async def plant(writer: Bus, stream: str, subject: str, stream_seq: int, data: bytes) -> int:
    """A dead letter as ``writer`` may write it, with headers of its choosing."""
    headers = {
        "Trainyard-Reason": "gave up",
        "Trainyard-Subject": subject,
        "Trainyard-Stream-Seq": str(stream_seq),
        "Trainyard-Size": str(len(data)),
        "Nats-Msg-Id": f"planted:{subject}:{stream_seq}",
    }
    return (await writer.publish_raw(subjects.deadletter(stream), data, headers)).seq


async def messages(admin: Bus, stream: str) -> int:
    return (await admin.js.stream_info(stream)).state.messages


async def test_a_dead_letter_planted_by_admission_for_another_tenant_is_refused(connect: Connect) -> None:
    admission, gateway, admin = await connect("admission"), await connect("gateway"), await connect("admin")
    portal = await connect("portal-acme")
    acme = await portal.publish(subjects.intake("acme"), BETA, msg_id="submit:acme:a-1")
    planted = [
        # A subject header naming beta's intake, at a sequence the stream never held.
        await plant(admission, "INTAKE", subjects.intake("beta"), 999, encode(BETA)),
        # ... at a sequence that holds a message on another subject.
        await plant(admission, "INTAKE", subjects.intake("beta"), acme.seq, encode(BETA)),
        # The right subject and sequence with other data.
        await plant(admission, "INTAKE", subjects.intake("acme"), acme.seq, b'{"type": "CancelJob"}'),
    ]
    reasons = []
    for seq in planted:
        with pytest.raises(deadletters.NotReplayable) as refused:
            await deadletters.replay(gateway, seq, "operator:alice")
        reasons.append(str(refused.value))
    assert "INTAKE seq 999, which is not in the stream" in reasons[0]
    assert "'trainyard.intake.beta'" in reasons[1] and "'trainyard.intake.acme'" in reasons[1]
    assert "does not hold the data of INTAKE seq" in reasons[2]
    assert await messages(admin, "INTAKE") == 1  # nothing was published


async def test_a_dead_letter_planted_by_health_to_drain_a_node_is_refused(connect: Connect) -> None:
    health, gateway, admin = await connect("health"), await connect("gateway"), await connect("admin")
    drain = b'{"type": "DrainNode", "node_id": "n07", "reason": "planted"}'
    seq = await plant(health, "NODES", subjects.node("local", "n07"), 1, drain)
    with pytest.raises(deadletters.NotReplayable, match="NODES seq 1, which is not in the stream"):
        await deadletters.replay(gateway, seq, "operator:alice")
    assert await messages(admin, "NODES") == 0


async def test_a_genuine_dead_letter_is_replayed_from_the_original_naming_who_asked(connect: Connect) -> None:
    portal, admission, gateway = await connect("portal-acme"), await connect("admission"), await connect("gateway")
    admin = await connect("admin")
    original = await portal.publish(subjects.intake("acme"), BETA, msg_id="submit:acme:a-2")
    seq = await plant(admission, "INTAKE", subjects.intake("acme"), original.seq, encode(BETA))
    done = await deadletters.replay(gateway, seq, "operator:alice")
    again = await admin.js.get_msg("INTAKE", done.replayed_seq)
    assert again.subject == subjects.intake("acme") and again.data == encode(BETA)
    assert again.headers is not None and again.headers["Trainyard-Replayed-By"] == "operator:alice"
    assert again.headers["Nats-Msg-Id"] == done.msg_id
