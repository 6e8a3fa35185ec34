"""The usage ledger: one row per run, fed by job lifecycle events.

Exactly-once rule: :meth:`Ledger.apply` takes a batch of ``(event_id, event)``
pairs (the event id is the JetStream stream sequence) and applies it in one
transaction.  Each new event id is inserted into ``applied_events``, whose
primary key refuses a second copy; ids already there are skipped.  Either the
whole batch and its ids are stored, or nothing is, so a consumer acks only
after ``apply`` returns and a redelivered batch changes nothing.

Events may also arrive out of order or twice under different ids (a
producer that published again).  Run rows hold the facts the metering core
folds commutatively (earliest placement and start; the first end in log
order, the event ids being stream sequences), so the stored row is the same
whatever the order of delivery.  Derived columns are recomputed from the
facts each time a run changes.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from trainyard.core.accounting.metering import overlap
from trainyard.events.jobs import JobEvent
from trainyard.ledger.batch import apply_batch, insert_ignore, lock_rows, write_runs
from trainyard.ledger.records import LedgerJob, LedgerRun, facts_from_row, ledger_job_from_row, ledger_run_from_row
from trainyard.ledger.schema import add_missing_columns, build_tables

_ATTEMPTS = 5  # tries of a batch that deadlocked with a concurrent writer
_RETRYABLE_SQLSTATES = {"40001", "40P01"}  # serialization failure, deadlock
GROUP_KEYS = ("tenant", "queue", "priority_class", "name", "job_id", "run_id", "gpu_type", "cluster")
_JOB_EVENTS = tuple(JobEvent.__args__)  # type: ignore[attr-defined]


class Ledger:
    """GPU usage per run, stored in SQLite (default) or PostgreSQL.

    ``url`` is a SQLAlchemy URL: ``sqlite:///path/to/ledger.db`` or
    ``postgresql+psycopg://user@host/db``.
    """

    def __init__(self, url: str, *, prefix: str = "") -> None:
        self.url = url
        self.tables = build_tables(prefix)
        json = {"json_serializer": _json_text, "json_deserializer": msgspec.json.decode}
        if url.startswith("sqlite"):
            memory = url in ("sqlite://", "sqlite:///:memory:")
            self.engine = sa.create_engine(
                url,
                connect_args={"timeout": 30},
                poolclass=sa.pool.StaticPool if memory else None,
                **json,
            )
            if not memory:
                sa.event.listen(self.engine, "connect", _sqlite_pragmas)
                _make_directory_of(self.engine.url.database)
        else:
            self.engine = sa.create_engine(url, pool_pre_ping=True, **json)

    # --- lifecycle ---------------------------------------------------------

    def create_schema(self) -> None:
        self.tables.metadata.create_all(self.engine)
        with self.engine.begin() as conn:
            add_missing_columns(conn, self.tables)

    def drop_schema(self) -> None:
        self.tables.metadata.drop_all(self.engine)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- writing -----------------------------------------------------------

    def apply(self, events: Sequence[tuple[str, JobEvent]]) -> int:
        """Apply a batch in one transaction; return how many events were new.

        Raises ``ValueError`` (and stores nothing) for an empty event id or
        something that is not a job event.  A batch that collides with a
        concurrent writer is retried; after that the database error is raised
        and nothing of the batch is stored.
        """
        batch: dict[str, JobEvent] = {}
        for event_id, event in events:
            if not isinstance(event_id, str) or not event_id or len(event_id) > 128:
                raise ValueError(f"event id must be a non-empty string of at most 128 characters, got {event_id!r}")
            if not isinstance(event, _JOB_EVENTS):
                raise ValueError(f"event {event_id} is a {type(event).__name__}, not a job lifecycle event")
            batch.setdefault(event_id, event)
        if not batch:
            return 0
        for attempt in range(_ATTEMPTS):
            try:
                with self.engine.begin() as conn:
                    return apply_batch(conn, self.tables, batch)
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
                conn.execute(insert_ignore(conn, t.checkpoints), new)
                rows = lock_rows(conn, t.runs, t.runs.c.run_id, [run_id])
                if rows:
                    write_runs(conn, t, rows, {run_id: facts_from_row(rows[run_id])})
            return len(new)

    # --- reading -----------------------------------------------------------

    def runs(
        self,
        *,
        tenant: str | None = None,
        job_id: str | None = None,
        start: float | None = None,
        end: float | None = None,
        open_only: bool = False,
    ) -> list[LedgerRun]:
        """Runs ordered by run id.  With ``start`` or ``end``, only runs that
        started and overlap [start, end) (open runs included); with
        ``open_only``, only runs that have not ended."""
        t = self.tables
        stmt = sa.select(t.runs, t.jobs.c.queue, t.jobs.c.priority_class, t.jobs.c.name, t.jobs.c.labels).join(
            t.jobs, t.jobs.c.job_id == t.runs.c.job_id, isouter=True
        )
        if tenant is not None:
            stmt = stmt.where(t.runs.c.tenant == tenant)
        if job_id is not None:
            stmt = stmt.where(t.runs.c.job_id == job_id)
        if open_only:
            stmt = stmt.where(t.runs.c.ended_at.is_(None))
        if start is not None or end is not None:
            stmt = stmt.where(t.runs.c.started_at.is_not(None))
        if end is not None:
            stmt = stmt.where(t.runs.c.started_at < end)
        if start is not None:
            stmt = stmt.where(sa.or_(t.runs.c.ended_at.is_(None), t.runs.c.ended_at > start))
        with self.engine.connect() as conn:
            result = conn.execute(stmt.order_by(t.runs.c.run_id))
            return [ledger_run_from_row(r._mapping) for r in result]

    def jobs(self, *, tenant: str | None = None, start: float | None = None, end: float | None = None) -> list[LedgerJob]:
        """Accepted jobs ordered by job id.  With ``end``, only jobs accepted
        before it; with ``start``, only jobs not cancelled before it."""
        t = self.tables
        stmt = sa.select(t.jobs).where(t.jobs.c.accepted_at.is_not(None))
        if tenant is not None:
            stmt = stmt.where(t.jobs.c.tenant == tenant)
        if end is not None:
            stmt = stmt.where(t.jobs.c.accepted_at < end)
        if start is not None:
            stmt = stmt.where(sa.or_(t.jobs.c.cancelled_at.is_(None), t.jobs.c.cancelled_at >= start))
        with self.engine.connect() as conn:
            return [ledger_job_from_row(r._mapping) for r in conn.execute(stmt.order_by(t.jobs.c.job_id))]

    def usage(
        self,
        tenant: str | None = None,
        start: float | None = None,
        end: float | None = None,
        now: float | None = None,
        group_by: Sequence[str] = ("tenant",),
    ) -> dict[tuple[Any, ...], float]:
        """GPU-seconds inside [start, end) per group, keyed by a tuple of the
        ``group_by`` values.  Open runs are metered up to ``now`` (the current
        time when not given).  Grouping by ``gpu_type`` splits runs that hold
        several types."""
        unknown = [key for key in group_by if key not in GROUP_KEYS]
        if unknown:
            raise ValueError(f"cannot group usage by {unknown}; choose from {list(GROUP_KEYS)}")
        now = time.time() if now is None else now
        totals: dict[tuple[Any, ...], float] = {}
        for run in self.runs(tenant=tenant, start=start, end=end):
            seconds = overlap(run.started_at, run.ended_at if run.ended_at is not None else now, start, end)
            if seconds <= 0:
                continue
            shares = run.gpus_by_type.items() if "gpu_type" in group_by else [(run.gpu_type, run.gpus)]
            for gpu_type, gpus in shares:
                values = {"gpu_type": gpu_type} | {k: getattr(run, k) for k in group_by if k != "gpu_type"}
                key = tuple(values[k] for k in group_by)
                totals[key] = totals.get(key, 0.0) + gpus * seconds
        return dict(sorted(totals.items(), key=lambda kv: tuple(str(v) for v in kv[0])))

    def total_gpu_seconds(self, now: float | None = None) -> float:
        """GPU-seconds of every ended run; with ``now``, open runs metered up to it too."""
        runs_t = self.tables.runs
        with self.engine.connect() as conn:
            total = conn.scalar(sa.select(sa.func.coalesce(sa.func.sum(runs_t.c.gpu_seconds), 0.0))) or 0.0
        if now is not None:
            total += sum(run.gpu_seconds_in(now=now) for run in self.runs(open_only=True))
        return float(total)

    def applied_count(self) -> int:
        """How many distinct event ids have been applied."""
        with self.engine.connect() as conn:
            return conn.scalar(sa.select(sa.func.count()).select_from(self.tables.applied_events)) or 0


def _json_text(value: Any) -> str:
    return msgspec.json.encode(value).decode()


def _sqlstate(exc: DBAPIError) -> str | None:
    return getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None)


def _make_directory_of(database: str | None) -> None:
    """SQLite creates the file on first connect, not the directory it is in."""
    if database:
        Path(database).parent.mkdir(parents=True, exist_ok=True)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cursor = dbapi_conn.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.close()
