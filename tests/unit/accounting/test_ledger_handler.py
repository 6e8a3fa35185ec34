"""Accounting's handler on the in-memory bus: what reaches the ledger, what is
dead-lettered, and what a database outage or a replay does, with no NATS.
(The fake bus is held to NATS by tests/integration/test_bus_contract.py.)"""

from __future__ import annotations

from typing import Any

import pytest
from accounting_builders import HOUR, T0, lifecycle
from sqlalchemy.exc import OperationalError

from trainyard.bus import ConsumerSpec
from trainyard.events import JobEvent, RunSucceeded, subjects
from trainyard.testing.fakes import FakeBus
from trainyard.testing.publish import publish_event
from trainyard_accounting.handlers import LedgerHandler
from trainyard_accounting.writer import LedgerWriter


def consumer(durable: str = "accounting") -> ConsumerSpec:
    return ConsumerSpec(stream="JOBS", durable=durable, filter_subject=subjects.JOBS_ALL, batch=1000)


class Clock:
    def __init__(self) -> None:
        self.now = T0 + 2 * HOUR

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def bus(clock: Clock) -> FakeBus:
    return FakeBus(clock=clock)


async def publish(bus: FakeBus, events: list[JobEvent]) -> None:
    for i, event in enumerate(events):
        await publish_event(bus, event, msg_id=f"{event.job_id}:{i}")  # type: ignore[arg-type]


async def test_a_run_is_metered_once_though_a_new_consumer_replays_the_stream(
    bus: FakeBus, ledger: LedgerWriter
) -> None:
    await publish(bus, lifecycle(gpus=16))
    handler = LedgerHandler(ledger)

    assert await bus.consume_once(consumer(), handler) == ["ack"] * 5
    assert await bus.consume_once(consumer("accounting-again"), handler) == ["ack"] * 5  # the durable was lost

    [run] = ledger.runs()
    assert (run.run_id, run.outcome, run.gpus, run.gpu_seconds) == ("r1", "succeeded", 16, 16 * HOUR)


async def test_an_event_on_another_writers_subject_is_dead_lettered_and_never_billed(
    bus: FakeBus, ledger: LedgerWriter
) -> None:
    await publish(bus, lifecycle(ended_at=None))
    forged = RunSucceeded(at=T0 + HOUR, job_id="j1", tenant="acme", run_id="r1")
    await bus.publish(subjects.job("acme", "j1", "admission"), forged, msg_id="forged")  # admission ends no run well

    assert await bus.consume_once(consumer(), LedgerHandler(ledger)) == ["ack"] * 4 + ["dead-letter"]

    [dead] = bus.messages("DEADLETTER")
    assert "may not be written by 'admission'" in dead.headers["Trainyard-Reason"]
    [run] = ledger.runs()
    assert run.outcome is None and run.ended_at is None


class Flaky(LedgerWriter):
    """A ledger whose database is down for its first ``outages`` batches."""

    def __init__(self, url: str, outages: int) -> None:
        super().__init__(url)
        self.outages = outages

    def apply(self, events: Any) -> int:
        if self.outages:
            self.outages -= 1
            raise OperationalError("INSERT", {}, ConnectionError("the database is not answering"))
        return super().apply(events)


async def test_a_database_outage_fails_the_batch_which_is_metered_when_it_comes_back(
    bus: FakeBus, clock: Clock, ledger_url: str
) -> None:
    await publish(bus, lifecycle())
    with Flaky(ledger_url, outages=1) as ledger:
        ledger.create_schema()
        handler = LedgerHandler(ledger)

        assert await bus.consume_once(consumer(), handler) == ["retry"] * 5
        assert await bus.consume_once(consumer(), handler) == []  # not before its delay
        clock.now += 1.0
        assert await bus.consume_once(consumer(), handler) == ["ack"] * 5

        [run] = ledger.runs()
        assert run.outcome == "succeeded" and run.gpu_seconds == 8 * HOUR
        assert bus.messages("DEADLETTER") == []
