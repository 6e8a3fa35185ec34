"""The usage ledger: one row per run, as every reader sees it.

The accounting service is the ledger's only writer
(``trainyard_accounting.writer.LedgerWriter`` applies JOBS events to it,
exactly once); the gateway's usage and finance routes, the console, the
finance commands and the capacity reports open it to read.  Each may create
the schema, which is idempotent, so no process waits for another to start.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import sqlalchemy as sa

from trainyard.core.accounting.metering import overlap
from trainyard.ledger.records import LedgerJob, LedgerRun, ledger_job_from_row, ledger_run_from_row
from trainyard.ledger.schema import add_missing_columns, build_tables

GROUP_KEYS = ("tenant", "queue", "priority_class", "name", "job_id", "run_id", "gpu_type", "cluster")


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
                url, connect_args={"timeout": 30}, poolclass=sa.pool.StaticPool if memory else None, **json
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

    def jobs(
        self, *, tenant: str | None = None, start: float | None = None, end: float | None = None
    ) -> list[LedgerJob]:
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

    def checkpoints(self, run_ids: Sequence[str]) -> dict[str, list[float]]:
        """Checkpoint times recorded for each of ``run_ids`` (in order; runs with none are absent)."""
        found: dict[str, list[float]] = {}
        ids = sorted(set(run_ids))
        t = self.tables.checkpoints
        with self.engine.connect() as conn:
            for i in range(0, len(ids), 500):
                stmt = sa.select(t.c.run_id, t.c.at).where(t.c.run_id.in_(ids[i : i + 500])).order_by(t.c.at)
                for run_id, at in conn.execute(stmt):
                    found.setdefault(run_id, []).append(at)
        return found

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


def _make_directory_of(database: str | None) -> None:
    """SQLite creates the file on first connect, not the directory it is in."""
    if database:
        Path(database).parent.mkdir(parents=True, exist_ok=True)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cursor = dbapi_conn.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.close()
