"""The squats of test_msg_id_squatting.py through the services' own code on
the locked bus: acme's portal takes the ids of beta's submission and cancel
first, the node agents' user the id of admission's acceptance; beta's job is
still submitted through the gateway, accepted by admission and cancelled."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from trainyard.bus import ConsumerSpec, run_consumer
from trainyard.domain import JobSpec, Role
from trainyard.events import subjects
from trainyard.store import Projector, Store, views
from trainyard.store.projections import RedisProjections
from trainyard.testing.locked_bus import Connect, locked_bus
from trainyard.testing.waiting import eventually
from trainyard_admission.handlers import IntakeHandler
from trainyard_gateway.jobs import JobOperations

BETA = JobSpec(tenant="beta", queue="q", roles=[Role(name="t", gpus_per_replica=8)], simulated_duration_s=600.0)
INTAKE = ConsumerSpec(stream="INTAKE", durable="admission-intake", filter_subject=subjects.INTAKE_ALL)


@pytest.fixture
async def connect(tmp_path: Path) -> AsyncIterator[Connect]:
    async with locked_bus(tmp_path) as (as_user, _):
        yield as_user


async def test_beta_submits_and_cancels_while_acme_and_the_agents_hold_its_ids(connect: Connect, store: Store) -> None:
    portal, agent = await connect("portal-acme"), await connect("emulator")
    gateway, admission = await connect("gateway"), await connect("admission")
    for taken in ("submit:beta:j-9", "cancel:j-9"):
        await portal.js.publish(subjects.intake("acme"), b'{"type": "Nonsense"}', headers={"Nats-Msg-Id": taken})
    await agent.js.publish(subjects.job("acme", "a-1", "agent"), b"{}", headers={"Nats-Msg-Id": "beta/j-9:accepted"})

    async def status_is(wanted: str) -> bool:
        job = await views.get_job(store, "j-9")
        return job is not None and job.status == wanted

    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(Projector(admission, store, "JOBS").run(stop)),
        asyncio.create_task(
            run_consumer(admission, INTAKE, IntakeHandler(RedisProjections(admission, store), time.time), stop)
        ),
    ]
    try:
        jobs = JobOperations(gateway, store)
        await jobs.submit(BETA, "j-9", actor="user:beta-researcher")
        await eventually(lambda: status_is("pending"), what="beta's job accepted")
        await jobs.cancel("j-9", "beta", actor="user:beta-researcher")
        await eventually(lambda: status_is("cancelled"), what="beta's job cancelled")
    finally:
        stop.set()
        await asyncio.gather(*tasks)
