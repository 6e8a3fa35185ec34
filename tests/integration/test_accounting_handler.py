"""The accounting service's handler over real JetStream messages: an event
whose subject disagrees with its body (a forged writer, another tenant) is
dead-lettered and never billed; the rest of the batch is."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from test_projection import lifecycle

from trainyard.bus import Bus, ConsumerSpec
from trainyard.bus.consumer import consume
from trainyard.events import RunSucceeded, subjects
from trainyard_accounting.handlers import LedgerHandler
from trainyard_accounting.writer import LedgerWriter


async def test_an_event_on_another_writers_subject_is_dead_lettered_and_not_billed(bus: Bus, tmp_path: Path) -> None:
    await lifecycle(bus, "j1", "j1-r1", "n1", [0, 1, 2, 3])
    forged = RunSucceeded(at=9.0, job_id="j1", tenant="acme", run_id="j1-r1")
    await bus.publish(
        subjects.job("acme", "j1", "admission"), forged, msg_id="forged"
    )  # admission may not end a run well
    elsewhere = RunSucceeded(at=9.0, job_id="j1", tenant="acme", run_id="j1-r1")
    await bus.publish(subjects.job("beta", "j1", "agent"), elsewhere, msg_id="other-tenant")
    spec = ConsumerSpec(stream="JOBS", durable="test-accounting", filter_subject=subjects.JOBS_ALL)
    sub = await bus.pull(spec)
    msgs: list[Any] = []
    async with asyncio.timeout(10):
        while len(msgs) < 6:  # a fetch returns what has arrived so far: ask until all six are in hand
            msgs += await sub.fetch(6 - len(msgs), timeout=10)
    with LedgerWriter(f"sqlite:///{tmp_path / 'ledger.db'}") as ledger:
        ledger.create_schema()

        fates = await consume(bus, spec, LedgerHandler(ledger), msgs)

        assert fates == ["ack"] * 4 + ["dead-letter"] * 2
        reasons = [(await bus.js.get_msg("DEADLETTER", seq)).headers["Trainyard-Reason"] for seq in (1, 2)]
        assert "may not be written by 'admission'" in reasons[0] and "sent on" in reasons[1]
        [run] = ledger.runs()
        assert run.run_id == "j1-r1" and run.outcome is None and run.started_at == 4.0  # still running
