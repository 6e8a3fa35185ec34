"""Accounting's handler: every JOBS event goes into the ledger, exactly once.

A batch is committed in one transaction before any of it is acknowledged; the
ledger skips event ids (stream sequences) it has already applied, so a
redelivery after a crash between commit and ack charges nothing twice.
Checkpoints are recorded too, so work lost to preemption or a node failure is
measured from the run's last checkpoint.

A message that is not a job event, or whose subject disagrees with its body
(a forged writer's event), is dead-lettered by the bus and never billed.  An
event the ledger cannot store (a value too large for its column, say) must
not hold up the events around it: when a batch fails for such a reason, its
events are applied one at a time and only the one that fails is dead-lettered.
Database outages are not bad data: they fail the batch, which is retried.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from sqlalchemy.exc import DataError, IntegrityError

from trainyard.bus import Delivery, JobEvents, Outcome
from trainyard.events import CheckpointSaved, JobCancelled, JobEvent, RunFailed, RunSucceeded
from trainyard.observability.logs import kv
from trainyard.observability.metrics import LedgerMetrics
from trainyard_accounting.writer import LedgerWriter

log = logging.getLogger(__name__)

#: Errors that mean "this event cannot be stored", not "the database is down".
BAD_DATA = (ValueError, TypeError, OverflowError, UnicodeError, DataError, IntegrityError)


def run_outcome(event: JobEvent) -> str | None:
    """How a run ended, for an event that ends one (None otherwise)."""
    if isinstance(event, RunSucceeded):
        return "succeeded"
    if isinstance(event, RunFailed):
        return f"failed:{event.reason}"
    if isinstance(event, JobCancelled) and event.run_id:
        return "cancelled"
    return None


class LedgerHandler(JobEvents):
    """Every JOBS event into the ledger, keyed by its stream sequence."""

    def __init__(self, ledger: LedgerWriter, metrics: LedgerMetrics | None = None) -> None:
        self.ledger = ledger
        self.metrics = metrics

    async def handle(self, batch: Sequence[Delivery[JobEvent]]) -> list[Outcome]:
        outcomes = [Outcome.done()] * len(batch)
        events = [(i, str(d.seq), d.event) for i, d in enumerate(batch)]
        # The database calls block; keep the event loop (and acks) moving.
        try:
            await asyncio.to_thread(self.ledger.apply, [(event_id, event) for _, event_id, event in events])
        except BAD_DATA:
            events = await self._one_at_a_time(events, outcomes)
        checkpoints: dict[str, list[float]] = {}
        for _, _, event in events:
            if isinstance(event, CheckpointSaved):
                checkpoints.setdefault(event.run_id, []).append(event.at)
        for run_id, times in checkpoints.items():  # idempotent: a checkpoint time is recorded once
            await asyncio.to_thread(self.ledger.record_checkpoints, run_id, times)
        for _, event_id, event in events:
            self._metered(event_id, event)
        return outcomes

    def _metered(self, event_id: str, event: JobEvent) -> None:
        outcome = run_outcome(event)
        if outcome is None:
            return
        run_id = getattr(event, "run_id", None)
        log.info(
            "run metered",
            extra=kv(
                decision="metered",
                job_id=event.job_id,
                run_id=run_id,
                tenant=event.tenant,
                outcome=outcome,
                seq=event_id,
            ),
        )
        if self.metrics is not None:
            self.metrics.metered.labels(outcome.split(":", 1)[0]).inc()

    async def _one_at_a_time(
        self, events: list[tuple[int, str, JobEvent]], outcomes: list[Outcome]
    ) -> list[tuple[int, str, JobEvent]]:
        """Apply each event alone; the ones the ledger refuses become poison."""
        stored = []
        for i, event_id, event in events:
            try:
                await asyncio.to_thread(self.ledger.apply, [(event_id, event)])
            except BAD_DATA as err:
                outcomes[i] = Outcome.poison(f"the ledger cannot store this {type(event).__name__}: {err!r}"[:1000])
                continue
            stored.append((i, event_id, event))
        return stored
