"""The fake projections answer as Redis does: every case runs on
``trainyard.testing.fakes.FakeProjections`` over a fake bus, and on
``RedisProjections`` over a real nats-server and Redis with the projectors'
Lua folds.  (The fake fakes only the reads in ``trainyard.store.projections``.)"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from trainyard.bus import Bus
from trainyard.bus.consumer import Broker
from trainyard.core.admission.fit import FleetSummary
from trainyard.domain import JobSpec, NodeInfo, Role
from trainyard.domain.job import ValidationError
from trainyard.events import JobAccepted, JobAdmitted, JobCancelled, JobRejected, NodeRegistered, RunSucceeded, subjects
from trainyard.store import Store
from trainyard.store.projections import Projections, RedisProjections
from trainyard.testing.fakes import FakeBus, FakeProjections
from trainyard.testing.publish import publish_event
from trainyard.testing.streams import project

SPEC = JobSpec(tenant="acme", queue="q", roles=[Role(name="t", replicas=2, gpus_per_replica=4)])


@dataclass
class Side:
    bus: Broker
    projections: Projections
    caught_up: Callable[[], Awaitable[None]]  # wait until the projections hold everything published


@pytest.fixture(params=["fake", "redis"])
def side(request: pytest.FixtureRequest) -> Side:
    if request.param == "fake":
        fake = FakeBus()

        async def at_once() -> None:
            pass

        return Side(fake, FakeProjections(fake), at_once)
    bus: Bus = request.getfixturevalue("bus")
    store: Store = request.getfixturevalue("store")

    async def projected() -> None:
        await project(bus, store, "JOBS", "NODES")

    return Side(bus, RedisProjections(bus, store), projected)


async def publish(side: Side, *events: Any) -> list[int]:
    return [(await publish_event(side.bus, e, msg_id=f"e{i}")).seq for i, e in enumerate(events)]  # type: ignore[arg-type]


async def test_a_job_never_published_is_none(side: Side) -> None:
    await publish(side, JobAccepted(at=1.0, job_id="j1", spec=SPEC, submitted_at=0.5))
    await side.caught_up()

    assert await side.projections.job("j2") is None


async def test_a_job_reads_as_the_fold_of_its_events(side: Side) -> None:
    seqs = await publish(
        side,
        JobAccepted(at=1.0, job_id="j1", spec=SPEC, submitted_at=0.5),
        JobAccepted(at=1.5, job_id="j2", spec=SPEC, submitted_at=0.7),
        JobAdmitted(at=2.0, job_id="j1", tenant="acme", run_id="r1", attempt=1),
        JobCancelled(at=3.0, job_id="j1", tenant="acme", run_id="r1", reason="not needed"),
    )
    await side.caught_up()

    job = await side.projections.job("j1")
    assert job is not None
    assert (job.status, job.tenant, job.queue, job.run_id, job.attempt) == ("cancelled", "acme", "q", "r1", 1)
    assert (job.last_seq, job.order, job.gpus, job.reason) == (seqs[3], seqs[0], 8, "not needed")
    assert (job.submitted_at, job.accepted_at, job.finished_at, job.job_spec) == (0.5, 1.0, 3.0, SPEC)
    other = await side.projections.job("j2")
    assert other is not None and (other.status, other.last_seq) == ("pending", seqs[1])


async def test_a_rejected_job_keeps_its_errors(side: Side) -> None:
    errors = [ValidationError("roles[0].replicas", "must be between 1 and 4096")]
    [seq] = await publish(side, JobRejected(at=1.0, job_id="j1", tenant="acme", errors=errors))
    await side.caught_up()

    job = await side.projections.job("j1")
    assert job is not None and (job.status, job.errors, job.last_seq, job.queue) == ("rejected", errors, seq, None)


async def test_an_event_whose_subject_disagrees_with_it_is_not_applied(side: Side) -> None:
    seqs = await publish(
        side,
        JobAccepted(at=1.0, job_id="j1", spec=SPEC, submitted_at=0.5),
        JobAdmitted(at=2.0, job_id="j1", tenant="acme", run_id="r1", attempt=1),
    )
    forged = RunSucceeded(at=3.0, job_id="j1", tenant="acme", run_id="r1")
    await side.bus.publish(
        subjects.job("acme", "j1", "admission"), forged, msg_id="forged"
    )  # admission ends no run well
    await side.caught_up()

    job = await side.projections.job("j1")
    assert job is not None and (job.status, job.last_seq) == ("admitted", seqs[1])


async def test_the_fleet_is_every_node_as_last_registered(side: Side) -> None:
    nodes = [
        NodeInfo(node_id="n1", cluster="c1", gpu_type="H100", gpus=8),
        NodeInfo(node_id="n2", cluster="c1", gpu_type="H100", gpus=8),
        NodeInfo(node_id="n3", cluster="c1", gpu_type="A100", gpus=4),
        NodeInfo(node_id="n2", cluster="c1", gpu_type="H100", gpus=4),  # registered again, with GPUs lost
    ]
    for i, node in enumerate(nodes):
        await side.bus.publish(
            subjects.node("c1", node.node_id), NodeRegistered(at=1.0, node=node, boot_id=f"b{i}"), f"r{i}"
        )
    await side.caught_up()

    expected = FleetSummary.of([("H100", 8), ("H100", 4), ("A100", 4)])
    assert await side.projections.fleet() == expected
    assert await side.projections.caught_up_fleet() == expected


async def test_an_empty_fleet_is_an_empty_summary(side: Side) -> None:
    await side.caught_up()

    assert await side.projections.fleet() == FleetSummary() == await side.projections.caught_up_fleet()
