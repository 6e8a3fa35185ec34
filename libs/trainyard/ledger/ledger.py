"""The usage ledger: one row per run, fed by job lifecycle events.

Exactly-once rule: :meth:`Ledger.apply` takes a batch of ``(event_id, event)``
pairs (the event id is the JetStream stream sequence) and applies it in one
transaction.  Each new event id is inserted into ``applied_events``, whose
primary key refuses a second copy; ids already there are skipped.  Either the
whole batch and its ids are stored, or nothing is, so a consumer acks only
after ``apply`` returns and a redelivered batch changes nothing.

Events may also arrive out of order or twice under different ids (a
producer that published again).  Run rows hold the facts the metering core
folds commutatively (earliest placement, start and end), so the stored row
is the same whatever the order.  Derived columns are recomputed from the
facts each time a run changes.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import msgspec
import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError, IntegrityError

from trainyard.core.accounting.metering import (
    CANCELLED,
    RunFacts,
    end_run,
    meter,
    observe,
    overlap,
)
from trainyard.events.jobs import JobAccepted, JobCancelled, JobEvent, JobRejected
from trainyard.ledger.schema import build_tables

_CHUNK = 500  # ids per IN (...) list
_ATTEMPTS = 3  # tries of a batch that collided with a concurrent writer
_RETRYABLE_SQLSTATES = {"40001", "40P01"}  # serialization failure, deadlock
_FACT_COLUMNS = ("attempt", "cluster", "admitted_at", "placed_at", "started_at", "ended_at", "outcome")
GROUP_KEYS = ("tenant", "queue", "priority_class", "name", "job_id", "run_id", "gpu_type", "cluster")
_JOB_EVENTS = tuple(JobEvent.__args__)  # type: ignore[attr-defined]


class LedgerRun(msgspec.Struct, frozen=True, kw_only=True):
    """A run as the ledger holds it, with its job's attributes."""

    run_id: str
    job_id: str
    tenant: str
    queue: str | None
    priority_class: str | None
    name: str | None
    labels: dict[str, str]
    attempt: int | None
    cluster: str | None
    gpus: int
    gpu_type: str | None
    gpus_by_type: dict[str, int]
    placed_at: float | None
    started_at: float | None
    ended_at: float | None
    outcome: str | None
    gpu_seconds: float | None  # None while the run is open
    lost_seconds: float | None
    idle_seconds: float | None

    def gpu_seconds_in(self, start: float | None = None, end: float | None = None, now: float | None = None) -> float:
        """GPU-seconds inside [start, end); an open run is metered up to ``now``."""
        until = self.ended_at if self.ended_at is not None else now
        return self.gpus * overlap(self.started_at, until, start, end)


def _chunks(items: Sequence[Any]) -> Iterator[Sequence[Any]]:
    for i in range(0, len(items), _CHUNK):
        yield items[i : i + _CHUNK]


def _gpu_type_label(by_type: dict[str, int]) -> str | None:
    return "+".join(sorted(by_type)) or None


class Ledger:
    """GPU usage per run, stored in SQLite (default) or PostgreSQL.

    ``url`` is a SQLAlchemy URL: ``sqlite:///path/to/ledger.db`` or
    ``postgresql+psycopg://user@host/db``.
    """

    def __init__(self, url: str, *, prefix: str = "") -> None:
        self.url = url
        self.tables = build_tables(prefix)
        if url.startswith("sqlite"):
            memory = url in ("sqlite://", "sqlite:///:memory:")
            self.engine = sa.create_engine(
                url,
                connect_args={"timeout": 30},
                poolclass=sa.pool.StaticPool if memory else None,
            )
            if not memory:
                sa.event.listen(self.engine, "connect", _sqlite_pragmas)
        else:
            self.engine = sa.create_engine(url, pool_pre_ping=True)

    # --- lifecycle ---------------------------------------------------------

    def create_schema(self) -> None:
        self.tables.metadata.create_all(self.engine)

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
                    return self._apply(conn, batch)
            except (IntegrityError, DBAPIError) as exc:
                retryable = isinstance(exc, IntegrityError) or _sqlstate(exc) in _RETRYABLE_SQLSTATES
                if not retryable or attempt == _ATTEMPTS - 1:
                    raise
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
                conn.execute(sa.insert(t.checkpoints), new)
                rows = self._lock_runs(conn, t.runs.c.run_id, [run_id])
                self._write_runs(conn, rows, {run_id: _facts(rows[run_id])} if rows else {})
            return len(new)

    def _apply(self, conn: sa.Connection, batch: dict[str, JobEvent]) -> int:
        t = self.tables
        # 1. Drop events whose ids are already stored, then store the new ids.
        ids = list(batch)
        seen: set[str] = set()
        for chunk in _chunks(ids):
            seen.update(conn.scalars(sa.select(t.applied_events.c.event_id).where(t.applied_events.c.event_id.in_(chunk))))
        new = [(event_id, batch[event_id]) for event_id in ids if event_id not in seen]
        if not new:
            return 0
        conn.execute(sa.insert(t.applied_events), [{"event_id": i, "event_type": type(e).__name__} for i, e in new])
        # 2. Sort events into job-wide ones and per-run ones.
        accepted: dict[str, JobAccepted] = {}
        job_cancels: dict[str, float] = {}
        by_run: dict[str, list[JobEvent]] = {}
        tenants: dict[str, str] = {}
        for _, event in new:
            if isinstance(event, JobRejected):
                continue  # never ran: nothing to meter
            if isinstance(event, JobAccepted):
                tenants[event.job_id] = event.spec.tenant
                best = accepted.get(event.job_id)
                if best is None or event.at < best.at:
                    accepted[event.job_id] = event
            elif isinstance(event, JobCancelled) and event.run_id is None:
                tenants[event.job_id] = event.tenant
                job_cancels[event.job_id] = min(event.at, job_cancels.get(event.job_id, event.at))
            else:
                tenants.setdefault(event.job_id, event.tenant)
                by_run.setdefault(event.run_id, []).append(event)
        # 3. Merge job-wide facts into the job rows (stubs for jobs not yet accepted).
        jobs = self._merge_jobs(conn, tenants, accepted, job_cancels)
        # 4. Fold run events into run rows; a job-wide event touches every run of its job.
        rows = self._lock_runs(conn, t.runs.c.run_id, sorted(by_run))
        rows.update(self._lock_runs(conn, t.runs.c.job_id, sorted(set(accepted) | set(job_cancels))))
        changed: dict[str, RunFacts] = {}
        for run_id in sorted(set(rows) | set(by_run)):
            facts = _facts(rows[run_id]) if run_id in rows else None
            for event in by_run.get(run_id, ()):
                facts = observe(facts, event)
            assert facts is not None
            cancelled_at = jobs[facts.job_id]["cancelled_at"] if facts.job_id in jobs else None
            if cancelled_at is not None:
                facts = end_run(facts, cancelled_at, CANCELLED)
            changed[run_id] = facts
        self._write_runs(conn, rows, changed, jobs)
        return len(new)

    def _merge_jobs(
        self,
        conn: sa.Connection,
        tenants: dict[str, str],
        accepted: dict[str, JobAccepted],
        job_cancels: dict[str, float],
    ) -> dict[str, dict[str, Any]]:
        jobs_t = self.tables.jobs
        rows: dict[str, dict[str, Any]] = {}
        for chunk in _chunks(sorted(tenants)):
            stmt = sa.select(jobs_t).where(jobs_t.c.job_id.in_(chunk)).order_by(jobs_t.c.job_id).with_for_update()
            rows.update({r.job_id: dict(r._mapping) for r in conn.execute(stmt)})
        inserts, updates = [], []
        for job_id, tenant in tenants.items():
            old = rows.get(job_id)
            row = dict(old) if old else {c.name: None for c in jobs_t.columns} | {"job_id": job_id, "tenant": tenant}
            event = accepted.get(job_id)
            if event is not None and (row["accepted_at"] is None or event.at < row["accepted_at"]):
                spec = event.spec
                roles = {r.name: [r.gpu_type, r.gpus] for r in spec.roles}
                row.update(
                    tenant=spec.tenant,
                    queue=spec.queue,
                    priority_class=spec.priority_class,
                    name=spec.name,
                    labels=dict(spec.labels),
                    roles=roles,
                    gpu_type="+".join(sorted(spec.gpu_types)) or None,
                    submitted_at=event.submitted_at,
                    accepted_at=event.at,
                )
            cancel = job_cancels.get(job_id)
            if cancel is not None and (row["cancelled_at"] is None or cancel < row["cancelled_at"]):
                row["cancelled_at"] = cancel
            rows[job_id] = row
            if old is None:
                inserts.append(row)
            elif row != old:
                updates.append({f"b_{k}": v for k, v in row.items()})
        if inserts:
            conn.execute(sa.insert(jobs_t), inserts)
        if updates:
            values = {c.name: sa.bindparam(f"b_{c.name}") for c in jobs_t.columns if c.name != "job_id"}
            stmt = sa.update(jobs_t).where(jobs_t.c.job_id == sa.bindparam("b_job_id")).values(values)
            conn.execute(stmt, updates)
        return rows

    def _lock_runs(self, conn: sa.Connection, column: sa.Column, keys: Sequence[str]) -> dict[str, dict[str, Any]]:
        runs_t = self.tables.runs
        rows: dict[str, dict[str, Any]] = {}
        for chunk in _chunks(keys):
            stmt = sa.select(runs_t).where(column.in_(chunk)).order_by(runs_t.c.run_id).with_for_update()
            rows.update({r.run_id: dict(r._mapping) for r in conn.execute(stmt)})
        return rows

    def _write_runs(
        self,
        conn: sa.Connection,
        rows: dict[str, dict[str, Any]],
        changed: dict[str, RunFacts],
        jobs: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        t = self.tables
        if not changed:
            return
        job_ids = sorted({f.job_id for f in changed.values()} - set(jobs or {}))
        jobs = dict(jobs or {})
        for chunk in _chunks(job_ids):
            for r in conn.execute(sa.select(t.jobs).where(t.jobs.c.job_id.in_(chunk))):
                jobs[r.job_id] = dict(r._mapping)
        ended_infra = sorted(r for r, f in changed.items() if f.outcome and f.outcome.startswith("failed:"))
        checkpoints: dict[str, list[float]] = {}
        for chunk in _chunks(ended_infra):
            stmt = sa.select(t.checkpoints).where(t.checkpoints.c.run_id.in_(chunk))
            for r in conn.execute(stmt):
                checkpoints.setdefault(r.run_id, []).append(r.at)
        inserts, updates = [], []
        for run_id, facts in changed.items():
            job = jobs.get(facts.job_id) or {}
            roles = {name: (gpu_type, gpus) for name, (gpu_type, gpus) in (job.get("roles") or {}).items()}
            usage = meter(facts, roles=roles, checkpoints=checkpoints.get(run_id, ()))
            ended = facts.ended_at is not None
            row = {c: getattr(facts, c) for c in _FACT_COLUMNS} | {
                "run_id": run_id,
                "job_id": facts.job_id,
                "tenant": facts.tenant,
                "placement": dict(facts.placement),
                "gpus": usage.gpus,
                "gpus_by_type": usage.gpus_by_type,
                "gpu_type": _gpu_type_label(usage.gpus_by_type),
                "gpu_seconds": usage.gpu_seconds if ended else None,
                "lost_seconds": usage.lost_seconds if ended else None,
                "idle_seconds": usage.idle_seconds if ended else None,
            }
            old = rows.get(run_id)
            if old is None:
                inserts.append(row)
            elif any(old[k] != v for k, v in row.items()):
                updates.append({f"b_{k}": v for k, v in row.items()})
        if inserts:
            conn.execute(sa.insert(t.runs), inserts)
        if updates:
            values = {c.name: sa.bindparam(f"b_{c.name}") for c in t.runs.columns if c.name != "run_id"}
            stmt = sa.update(t.runs).where(t.runs.c.run_id == sa.bindparam("b_run_id")).values(values)
            conn.execute(stmt, updates)

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
            return [_ledger_run(r._mapping) for r in result]

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


def _facts(row: dict[str, Any]) -> RunFacts:
    return RunFacts(
        run_id=row["run_id"],
        job_id=row["job_id"],
        tenant=row["tenant"],
        placement=dict(row["placement"] or {}),
        **{c: row[c] for c in _FACT_COLUMNS},
    )


def _ledger_run(row: Any) -> LedgerRun:
    return LedgerRun(
        run_id=row["run_id"],
        job_id=row["job_id"],
        tenant=row["tenant"],
        queue=row["queue"],
        priority_class=row["priority_class"],
        name=row["name"],
        labels=dict(row["labels"] or {}),
        attempt=row["attempt"],
        cluster=row["cluster"],
        gpus=row["gpus"],
        gpu_type=row["gpu_type"],
        gpus_by_type=dict(row["gpus_by_type"] or {}),
        placed_at=row["placed_at"],
        started_at=row["started_at"],
        ended_at=row["ended_at"],
        outcome=row["outcome"],
        gpu_seconds=row["gpu_seconds"],
        lost_seconds=row["lost_seconds"],
        idle_seconds=row["idle_seconds"],
    )


def _sqlstate(exc: DBAPIError) -> str | None:
    return getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cursor = dbapi_conn.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.close()
