"""Admission's intake on the in-memory bus and projections: the whole
decision path (decode, check, fence, what a refusal means, dead letters)
in milliseconds, with no servers.  The fakes are held to NATS and Redis by
tests/integration/test_bus_contract.py and test_projections_contract.py."""

from __future__ import annotations

import json

import msgspec
import pytest

from trainyard.bus import ConsumerSpec
from trainyard.domain import JobSpec, NodeInfo, Role
from trainyard.events import (
    CancelJob,
    JobAccepted,
    JobAdmitted,
    JobCancelled,
    JobEvent,
    JobRejected,
    NodeRegistered,
    SubmitJob,
    decode_job_event,
    encode,
    subjects,
)
from trainyard.observability.metrics import AdmissionMetrics
from trainyard.testing.fakes import FakeBus, FakeProjections
from trainyard.testing.publish import publish_event
from trainyard_admission.handlers import IntakeHandler

SPEC = JobSpec(tenant="acme", queue="q", roles=[Role(name="t", gpus_per_replica=8)], simulated_duration_s=1.0)
INTAKE = ConsumerSpec(stream="INTAKE", durable="admission-intake", filter_subject=subjects.INTAKE_ALL)


class Intake:
    """Admission's intake handler over a fake bus and fake projections, on a
    clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0
        self.bus = FakeBus(clock=lambda: self.now)
        self.projections = FakeProjections(self.bus)
        self.metrics = AdmissionMetrics()
        self.handler = IntakeHandler(self.projections, lambda: self.now, metrics=self.metrics)
        self.sent = 0

    async def send(self, payload: bytes, tenant: str = "acme") -> None:
        self.sent += 1
        await self.bus.publish_raw(subjects.intake(tenant), payload, {"Nats-Msg-Id": f"m{self.sent}"})

    async def submit(self, job_id: str, tenant: str = "acme", spec: JobSpec = SPEC) -> None:
        await self.send(encode(SubmitJob(at=1.0, spec=spec, job_id=job_id)), tenant)

    async def cancel(self, job_id: str, tenant: str = "acme") -> None:
        await self.send(encode(CancelJob(at=2.0, job_id=job_id, tenant=tenant)), tenant)

    async def deliver(self) -> list[str]:
        """Hand the intake what is ready now; each message's fate."""
        return await self.bus.consume_once(INTAKE, self.handler)

    def later(self, seconds: float) -> None:
        self.now += seconds

    def jobs(self) -> list[JobEvent]:
        return [decode_job_event(m.data) for m in self.bus.messages("JOBS")]

    def reasons(self) -> list[str]:
        return [m.headers["Trainyard-Reason"] for m in self.bus.messages("DEADLETTER")]

    def decisions(self, decision: str) -> float:
        return (
            self.metrics.registry.get_sample_value("trainyard_admission_decisions_total", {"decision": decision}) or 0
        )


@pytest.fixture
def intake() -> Intake:
    return Intake()


async def test_a_submission_sent_twice_is_accepted_and_counted_once(intake: Intake) -> None:
    await intake.submit("j1")
    await intake.submit("j1")  # a retry, under another message id

    assert await intake.deliver() == ["ack", "ack"]  # the second is refused by the fence: the tenant's own job

    [accepted] = intake.jobs()
    assert isinstance(accepted, JobAccepted) and accepted.job_id == "j1" and accepted.spec == SPEC
    assert intake.decisions("accepted") == 1


async def test_a_job_id_another_tenant_holds_is_dead_lettered(intake: Intake) -> None:
    await intake.submit("j1", tenant="globex", spec=msgspec.structs.replace(SPEC, tenant="globex"))
    await intake.submit("j1")

    assert await intake.deliver() == ["ack", "dead-letter"]
    assert intake.reasons() == ["job id 'j1' is already in use; submit with another job id"]


async def test_a_refusal_the_projection_cannot_explain_yet_is_retried(intake: Intake) -> None:
    intake.projections.lagging = True  # the acceptance below is not projected yet
    await intake.submit("j1")
    assert await intake.deliver() == ["ack"]
    await intake.submit("j1")

    assert await intake.deliver() == ["retry"]  # refused, and whose the job id is cannot be read yet
    intake.projections.lagging = False
    intake.later(0.5)
    assert await intake.deliver() == ["ack"]
    assert len(intake.jobs()) == 1 and intake.reasons() == []


async def test_a_malformed_command_naming_its_job_id_is_rejected_under_it(intake: Intake) -> None:
    await intake.send(json.dumps({"type": "SubmitJob", "at": 1, "job_id": "bad", "spec": {"tenant": "acme"}}).encode())
    await intake.send(b"\x00 not json")

    assert await intake.deliver() == ["ack", "dead-letter"]
    [rejected] = intake.jobs()
    assert isinstance(rejected, JobRejected) and rejected.job_id == "bad"
    assert rejected.errors[0].field == "payload" and "missing required field" in rejected.errors[0].message
    assert intake.reasons() == [
        "not a valid intake command and no job_id to reject it under: JSON is malformed: invalid character (byte 0)"
    ]


async def test_a_cancel_waits_for_its_job_and_a_stale_one_looks_again(intake: Intake) -> None:
    await intake.cancel("j1")
    assert await intake.deliver() == ["retry"]  # not known yet

    await intake.submit("j1")
    intake.later(1.0)
    assert await intake.deliver() == ["retry", "ack"]  # the cancel, due again, came before the submission
    intake.projections.catch_up()
    intake.projections.lagging = True  # the admission below is not projected yet
    await publish_event(intake.bus, JobAdmitted(at=3.0, job_id="j1", tenant="acme", run_id="r1", attempt=1), "adm")
    intake.later(1.0)
    assert await intake.deliver() == ["retry"]  # fenced: the job moved on since it was read

    intake.projections.lagging = False
    intake.later(0.2)
    assert await intake.deliver() == ["ack"]
    cancelled = intake.jobs()[-1]
    assert isinstance(cancelled, JobCancelled) and cancelled.run_id == "r1"
    assert intake.decisions("cancelled") == 1


def gang(replicas: int) -> JobSpec:
    return msgspec.structs.replace(SPEC, roles=[Role(name="t", replicas=replicas, gpus_per_replica=8)])


async def test_a_gang_larger_than_the_fleet_is_rejected_only_on_a_fleet_view_that_is_caught_up(intake: Intake) -> None:
    async def register(node_id: str) -> None:
        node = NodeInfo(node_id=node_id, cluster="c1", gpu_type="H100", gpus=8)
        await intake.bus.publish(subjects.node("c1", node_id), NodeRegistered(at=1.0, node=node, boot_id="b1"), node_id)

    await register("n1")
    await register("n2")
    intake.projections.catch_up()
    intake.projections.lagging = True
    await register("n3")  # not projected yet
    await intake.submit("three", spec=gang(3))

    assert await intake.deliver() == ["wait"]  # too large for the view, which is behind: wait for it

    intake.projections.lagging = False
    intake.later(1.0)
    await intake.submit("four", spec=gang(4))
    assert await intake.deliver() == ["ack", "ack"]
    three, four = intake.jobs()
    assert isinstance(three, JobAccepted) and isinstance(four, JobRejected)
    assert any("the whole fleet has 24 (3 nodes)" in e.message for e in four.errors), four.errors
