"""One service's credential against another's durable consumer: a create
names an existing consumer to update it, so a user that may create consumers
on a stream could give accounting's durable another filter and jobs finishing
meanwhile would never be billed.  Tried here with the placement credential in
every form the server takes; and the consumer loop that notices a consumer
changed by someone who may (admin) and puts it back."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from trainyard.bus import Bus, ConsumerSpec, PublishDenied, run_consumer
from trainyard.bus import pull as pull_module
from trainyard.config.store import ConfigStore
from trainyard.events import subjects
from trainyard.testing.fakes import Scripted
from trainyard.testing.locked_bus import Connect, locked_bus
from trainyard.testing.tenancy import one_team
from trainyard.testing.waiting import eventually

ACCOUNTING = ConsumerSpec(stream="JOBS", durable="accounting", filter_subject=subjects.JOBS_ALL)
NOBODY = f"{subjects.PREFIX}.jobs.nobody.>"


@pytest.fixture
async def connect(tmp_path: Path) -> AsyncIterator[Connect]:
    async with locked_bus(tmp_path) as (as_user, _):
        yield as_user


def create(name_in: str) -> tuple[str, bytes]:
    """A create of consumer ``accounting`` on JOBS with the filter ``NOBODY``,
    in one of the forms the server takes."""
    config: dict[str, object] = {"ack_policy": "explicit", "filter_subject": NOBODY}
    api = "$JS.API.CONSUMER"
    if name_in == "durable":
        subject, config["durable_name"] = f"{api}.DURABLE.CREATE.JOBS.accounting", "accounting"
    elif name_in == "body":
        subject, config["name"] = f"{api}.CREATE.JOBS", "accounting"
    elif name_in == "subject":
        subject, config["name"] = f"{api}.CREATE.JOBS.accounting", "accounting"
    else:
        subject, config["name"] = f"{api}.CREATE.JOBS.accounting.{NOBODY}", "accounting"
    return subject, json.dumps({"stream_name": "JOBS", "config": config}).encode()


async def filter_of(bus: Bus, durable: str = "accounting") -> str | None:
    return (await bus.js.consumer_info("JOBS", durable)).config.filter_subject


@pytest.mark.parametrize(
    "name_in",
    [
        pytest.param("body", id="the bare create with the durable's name in the body"),
        pytest.param("subject", id="the create that names the consumer in the subject"),
        pytest.param("filter", id="the create that names the consumer and its filter in the subject"),
        pytest.param("durable", id="the durable create"),
    ],
)
async def test_placement_cannot_rewrite_accountings_durable(connect: Connect, name_in: str) -> None:
    accounting, placement = await connect("accounting"), await connect("placement")
    await accounting.pull(ACCOUNTING)
    subject, body = create(name_in)
    with pytest.raises(PublishDenied):
        await placement.nc.request(subject, body, timeout=5.0)
    assert await filter_of(accounting) == subjects.JOBS_ALL


async def test_ordered_consumers_and_watches_still_work_under_their_own_names(connect: Connect) -> None:
    """What placement, admission and the gateway follow is created under a
    fresh name the permissions allow (trainyard.bus.client.named_create)."""
    placement, admission, admin = await connect("placement"), await connect("admission"), await connect("admin")
    await admin.publish_raw(subjects.job("acme", "j-1", "admission"), b"{}", {"Nats-Msg-Id": "e-1"})
    sub = await placement.js.subscribe(subjects.JOBS_ALL, stream="JOBS", ordered_consumer=True)
    msg = await sub.next_msg(timeout=5.0)
    assert msg.subject == subjects.job("acme", "j-1", "admission")
    await (await ConfigStore.open(admin)).apply(one_team("acme", gpus=8), actor="test:admin")
    watcher = await (await ConfigStore.open(admission)).kv.watch("tenancy")
    entry = await watcher.updates(timeout=5.0)
    assert entry is not None and entry.key == "tenancy"


async def test_the_consumer_loop_puts_back_a_changed_consumer_and_handles_what_it_skipped(
    connect: Connect, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Admin may change any consumer: the same create an attacker would send.
    While accounting's durable has the filter ``NOBODY`` the server goes past
    j-2's event (certainly: the consumer delivers a later one that matches),
    and putting the filter back does not bring it back; the loop notices,
    puts the filter back and reads j-2's event back from the stream."""
    monkeypatch.setattr(pull_module, "CHECK_EVERY_S", 3600.0)  # once, at the first fetch
    accounting, admin = await connect("accounting"), await connect("admin")
    billing = Scripted()
    stop = asyncio.Event()

    def billed_for(job_id: str) -> int:
        return sum(1 for d in billing.seen if d.subject.split(".")[3] == job_id)

    async def handled(job_id: str) -> bool:
        return billed_for(job_id) > 0

    async def put_back() -> bool:
        return await filter_of(accounting) == subjects.JOBS_ALL

    async def publish(tenant: str, job_id: str) -> None:
        await admin.publish_raw(subjects.job(tenant, job_id, "agent"), b"{}", {"Nats-Msg-Id": job_id})

    with caplog.at_level(logging.WARNING, logger="trainyard.bus.consumer"):
        loop = asyncio.create_task(run_consumer(accounting, ACCOUNTING, billing, stop))
        try:
            await publish("acme", "j-1")
            await eventually(lambda: handled("j-1"), what="the first event billed")
            await admin.js.add_consumer(
                "JOBS", ConsumerConfig(durable_name="accounting", ack_policy=AckPolicy.EXPLICIT, filter_subject=NOBODY)
            )
            await publish("acme", "j-2")
            await publish("nobody", "j-3")  # delivered under the changed filter: j-2's event is behind it
            await eventually(lambda: handled("j-3"), what="the changed consumer delivered past j-2")
            assert billed_for("j-2") == 0
            monkeypatch.setattr(pull_module, "CHECK_EVERY_S", 0.1)
            await eventually(lambda: handled("j-2"), what="the event the changed consumer went past, billed")
            assert await put_back()
            await publish("acme", "j-4")
            await eventually(lambda: handled("j-4"), what="billing goes on after the filter is put back")
        finally:
            stop.set()
            await loop
    said = [r.getMessage() for r in caplog.records]
    [error] = [m for m in said if "was changed by another client (or made by another version)" in m][:1]
    assert f"filter_subject is {NOBODY!r}, not {subjects.JOBS_ALL!r}" in error and "putting its settings back" in error
    assert any("handled again" in m for m in said)
