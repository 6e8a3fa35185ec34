"""The ledger's writes: accounting is the only process that makes them.

Exactly-once rule: :meth:`LedgerWriter.apply` takes a batch of
``(event_id, event)`` pairs (the event id is the JetStream stream sequence)
and applies it in one transaction.  Each new event id is inserted into
``applied_events``, whose primary key refuses a second copy; ids already there
are skipped.  Either the whole batch and its ids are stored, or nothing is, so
the consumer acks only after ``apply`` returns and a redelivered batch changes
nothing.

Events may also arrive out of order or twice under different ids (a
producer that published again).  Run rows hold the facts the metering core
folds commutatively (earliest placement and start; the first end in log
order, the event ids being stream sequences), so the stored row is the same
whatever the order of delivery.  Derived columns are recomputed from the
facts each time a run changes (:mod:`trainyard_accounting.batch`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from trainyard.events.jobs import JobEvent
from trainyard.ledger import Ledger
from trainyard_accounting import batch

_ATTEMPTS = 5  # tries of a batch that deadlocked with a concurrent writer
_RETRYABLE_SQLSTATES = {"40001", "40P01"}  # serialization failure, deadlock
_JOB_EVENTS = tuple(JobEvent.__args__)  # type: ignore[attr-defined]


class LedgerWriter(Ledger):
    """The ledger as accounting holds it: every read of :class:`Ledger`, and
    the writes that meter JOBS events into it."""

    def apply(self, events: Sequence[tuple[str, JobEvent]]) -> int:
        """Apply a batch in one transaction; return how many events were new.

        Raises ``ValueError`` (and stores nothing) for an empty event id or
        something that is not a job event.  A batch that collides with a
        concurrent writer is retried; after that the database error is raised
        and nothing of the batch is stored.
        """
        events_by_id: dict[str, JobEvent] = {}
        for event_id, event in events:
            if not isinstance(event_id, str) or not event_id or len(event_id) > 128:
                raise ValueError(f"event id must be a non-empty string of at most 128 characters, got {event_id!r}")
            if not isinstance(event, _JOB_EVENTS):
                raise ValueError(f"event {event_id} is a {type(event).__name__}, not a job lifecycle event")
            events_by_id.setdefault(event_id, event)
        if not events_by_id:
            return 0
        for attempt in range(_ATTEMPTS):
            try:
                with self.engine.begin() as conn:
                    return batch.apply_batch(conn, self.tables, events_by_id)
            except DBAPIError as exc:
                if _sqlstate(exc) not in _RETRYABLE_SQLSTATES or attempt == _ATTEMPTS - 1:
                    raise
                time.sleep(0.01 * 2**attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    def record_checkpoints(self, run_id: str, times: Iterable[float]) -> int:
        """Record checkpoint times of a run (idempotent); return how many were new.

        A run that already ended has its lost work recomputed.
        """
        t = self.tables
        times = sorted(set(times))
        with self.engine.begin() as conn:
            known = {
                row.at for row in conn.execute(sa.select(t.checkpoints.c.at).where(t.checkpoints.c.run_id == run_id))
            }
            new = [{"run_id": run_id, "at": at} for at in times if at not in known]
            if new:
                conn.execute(batch.insert_ignore(conn, t.checkpoints), new)
                rows = batch.lock_rows(conn, t.runs, t.runs.c.run_id, [run_id])
                if rows:
                    batch.write_runs(conn, t, rows, {run_id: batch.facts_from_row(rows[run_id])})
            return len(new)


def _sqlstate(exc: DBAPIError) -> str | None:
    return getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None)
