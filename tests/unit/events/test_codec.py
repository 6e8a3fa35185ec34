"""The wire format: JSON tagged unions that old consumers can read from new producers."""

from __future__ import annotations

import json

import msgspec
import pytest

from trainyard.domain import JobSpec, NodeInfo, Role
from trainyard.domain.job import ValidationError
from trainyard.events import (
    CancelJob,
    JobAccepted,
    JobAdmitted,
    JobCancelled,
    JobPlaced,
    JobRejected,
    NodeHeartbeat,
    NodeLost,
    NodeRegistered,
    ReplicaPlacement,
    RunFailed,
    RunStarted,
    RunSucceeded,
    SubmitJob,
    decode_intake,
    decode_job_event,
    decode_node_event,
    encode,
    subjects,
)

SPEC = JobSpec(tenant="acme", queue="q", roles=[Role(name="t", replicas=2, gpus_per_replica=8)], image="img")
PLACED = [ReplicaPlacement(role="t", replica=i, rank=i, node_id=f"n{i}", gpus=list(range(8))) for i in range(2)]


@pytest.mark.parametrize(
    ("message", "decode"),
    [
        pytest.param(SubmitJob(at=1.0, spec=SPEC, job_id="j1"), decode_intake, id="SubmitJob"),
        pytest.param(CancelJob(at=1.0, job_id="j1", tenant="acme"), decode_intake, id="CancelJob"),
        pytest.param(JobAccepted(at=1.0, job_id="j1", spec=SPEC, submitted_at=0.5), decode_job_event, id="JobAccepted"),
        pytest.param(
            JobRejected(at=1.0, job_id="j1", tenant="acme", errors=[ValidationError("tenant", "bad")]),
            decode_job_event,
            id="JobRejected",
        ),
        pytest.param(
            JobAdmitted(at=1.0, job_id="j1", tenant="acme", run_id="j1-r1", attempt=1),
            decode_job_event,
            id="JobAdmitted",
        ),
        pytest.param(
            JobPlaced(at=1.0, job_id="j1", tenant="acme", run_id="j1-r1", cluster="c", replicas=PLACED),
            decode_job_event,
            id="JobPlaced",
        ),
        pytest.param(RunStarted(at=1.0, job_id="j1", tenant="acme", run_id="j1-r1"), decode_job_event, id="RunStarted"),
        pytest.param(
            RunSucceeded(at=1.0, job_id="j1", tenant="acme", run_id="j1-r1"), decode_job_event, id="RunSucceeded"
        ),
        pytest.param(
            RunFailed(at=1.0, job_id="j1", tenant="acme", run_id="j1-r1", reason="node_failure", node_id="n1"),
            decode_job_event,
            id="RunFailed",
        ),
        pytest.param(JobCancelled(at=1.0, job_id="j1", tenant="acme"), decode_job_event, id="JobCancelled"),
        pytest.param(
            NodeRegistered(at=1.0, node=NodeInfo(node_id="n1", cluster="c", gpu_type="H100", gpus=8), boot_id="b"),
            decode_node_event,
            id="NodeRegistered",
        ),
        pytest.param(
            NodeHeartbeat(at=1.0, node_id="n1", cluster="c", boot_id="b"), decode_node_event, id="NodeHeartbeat"
        ),
        pytest.param(
            NodeLost(at=1.0, node_id="n1", cluster="c", boot_id="b", last_heartbeat_at=0.0),
            decode_node_event,
            id="NodeLost",
        ),
    ],
)
def test_every_message_round_trips_and_carries_its_type(message, decode) -> None:
    data = encode(message)
    assert json.loads(data)["type"] == type(message).__name__
    assert decode(data) == message


def test_unknown_fields_from_a_newer_producer_are_ignored() -> None:
    raw = json.loads(encode(RunStarted(at=1.0, job_id="j1", tenant="acme", run_id="r1")))
    raw["gpu_clock_mhz"] = 1980
    raw["future"] = {"nested": [1, 2]}
    assert decode_job_event(json.dumps(raw).encode()) == RunStarted(at=1.0, job_id="j1", tenant="acme", run_id="r1")


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        pytest.param(
            b'{"type":"LaunchMissiles","at":1}', "Invalid value 'LaunchMissiles'", id="an unknown message type"
        ),
        pytest.param(
            b'{"type":"CancelJob","at":1,"tenant":"a"}', "missing required field `job_id`", id="a missing field"
        ),
        pytest.param(b"not json", "malformed", id="bytes that are not JSON"),
    ],
)
def test_bad_payloads_raise_errors_that_say_what_is_wrong(payload, words) -> None:
    with pytest.raises((msgspec.ValidationError, msgspec.DecodeError), match=words):
        decode_intake(payload)


@pytest.mark.parametrize(
    ("build", "value"),
    [
        pytest.param(subjects.intake, "acme.other", id="a dot would split the tenant over two subject tokens"),
        pytest.param(subjects.intake, "*", id="a wildcard would subscribe to every tenant"),
        pytest.param(lambda v: subjects.job("acme", v, "admission"), "j>", id="a job id with a wildcard"),
    ],
)
def test_subject_tokens_reject_what_nats_would_misread(build, value) -> None:
    with pytest.raises(ValueError, match="cannot be used in a subject"):
        build(value)


def test_subjects_carry_the_aggregate_and_its_id() -> None:
    assert subjects.job("acme", "j-1", "placement") == "trainyard.jobs.acme.j-1.placement"
    assert subjects.job_history("acme", "j-1") == "trainyard.jobs.acme.j-1.*"
    assert subjects.fence_of("trainyard.jobs.acme.j-1.agent") == "trainyard.jobs.acme.j-1.*"
    assert subjects.entity_id("trainyard.jobs.acme.j-1.agent") == "j-1"
    assert subjects.entity_id("trainyard.nodes.c1.n-7") == "n-7"
    with pytest.raises(ValueError, match="does not write job events"):
        subjects.job("acme", "j-1", "portal")
    assert subjects.node("c1", "n07") == "trainyard.nodes.c1.n07"
    assert subjects.intake("acme") == "trainyard.intake.acme"
