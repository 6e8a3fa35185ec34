"""The accounting service's handler over real JetStream messages: an event
whose subject disagrees with its body (a forged writer, another tenant) is
dead-lettered and never billed; the rest of the batch is."""

from __future__ import annotations

from pathlib import Path

from test_projection import lifecycle

from trainyard.bus import Bus, PoisonMessage
from trainyard.events import RunSucceeded, subjects
from trainyard_accounting.handlers import LedgerHandler
from trainyard_accounting.writer import LedgerWriter


async def test_an_event_on_another_writers_subject_is_dead_lettered_and_not_billed(bus: Bus, tmp_path: Path) -> None:
    await lifecycle(bus, "j1", "j1-r1", "n1", [0, 1, 2, 3])
    forged = RunSucceeded(at=9.0, job_id="j1", tenant="acme", run_id="j1-r1")
    await bus.publish(subjects.job("acme", "j1", "placement"), forged, msg_id="forged")  # placement may not end runs
    elsewhere = RunSucceeded(at=9.0, job_id="j1", tenant="acme", run_id="j1-r1")
    await bus.publish(subjects.job("beta", "j1", "agent"), elsewhere, msg_id="other-tenant")
    sub = await bus.js.pull_subscribe(subjects.JOBS_ALL, durable="test-accounting", stream="JOBS")
    msgs = await sub.fetch(6, timeout=10)
    with LedgerWriter(f"sqlite:///{tmp_path / 'ledger.db'}") as ledger:
        ledger.create_schema()

        outcomes = await LedgerHandler(ledger)(msgs)

        assert [type(o).__name__ for o in outcomes] == ["NoneType"] * 4 + ["PoisonMessage"] * 2
        assert all(isinstance(o, PoisonMessage) for o in outcomes[4:])
        assert "may not be written by 'placement'" in str(outcomes[4]) and "sent on" in str(outcomes[5])
        [run] = ledger.runs()
        assert run.run_id == "j1-r1" and run.outcome is None and run.started_at == 4.0  # still running
