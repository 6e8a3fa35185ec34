"""Applying one batch of lifecycle events inside one database transaction.

The steps, all on the caller's connection:

1. insert the batch's event ids into ``applied_events``, skipping ids that
   are already there; only the events whose ids went in are applied;
2. make sure a row exists for every job and run the new events mention
   (insert-or-ignore), then lock those rows, in key order;
3. fold the events into the facts each row holds (the metering core's
   commutative fold, so arrival order and duplicates do not matter; a run's
   outcome follows log order, the event ids being stream sequences);
4. re-meter every run that changed and write back what differs.

Concurrent writers therefore never lose an update: ids and rows are claimed
with insert-or-ignore, which waits for a competing transaction and then
yields to it, and rows are read ``FOR UPDATE`` (PostgreSQL) or under the
database write lock (SQLite).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from trainyard.core.accounting.metering import CANCELLED, RunFacts, end_run, meter, observe
from trainyard.events.jobs import JobAccepted, JobCancelled, JobEvent, JobRejected
from trainyard.ledger.schema import LedgerTables

_CHUNK = 500  # keys per IN (...) list
#: Run columns that hold :class:`RunFacts` fields one to one.
FACT_COLUMNS = ("attempt", "cluster", "admitted_at", "placed_at", "started_at", "ended_at", "outcome", "ended_seq")


def chunks(items: Sequence[Any]) -> Iterator[Sequence[Any]]:
    for i in range(0, len(items), _CHUNK):
        yield items[i : i + _CHUNK]


def insert_ignore(conn: sa.Connection, table: sa.Table) -> Any:
    """An INSERT that skips rows whose primary key is already taken."""
    dialect = conn.dialect.name
    if dialect == "postgresql":
        return postgresql.insert(table).on_conflict_do_nothing()
    if dialect == "sqlite":
        return sqlite.insert(table).on_conflict_do_nothing()
    raise RuntimeError(f"the ledger supports SQLite and PostgreSQL, not {dialect}")


def facts_from_row(row: Any) -> RunFacts:
    return RunFacts(
        run_id=row["run_id"],
        job_id=row["job_id"],
        tenant=row["tenant"],
        placement=dict(row["placement"] or {}),
        **{c: row[c] for c in FACT_COLUMNS},
    )


def stream_seq(event_id: str) -> int | None:
    """The stream sequence an event id stands for (the accounting consumer
    uses the JetStream sequence as the id); None for any other id."""
    return int(event_id) if event_id.isdigit() else None


def apply_batch(conn: sa.Connection, t: LedgerTables, batch: dict[str, JobEvent]) -> int:
    """Apply the events of ``batch`` (event id -> event) whose ids are new;
    return how many there were."""
    # 1. Claim the event ids; the ones already applied come back empty.
    rows = [{"event_id": i, "event_type": type(batch[i]).__name__} for i in sorted(batch)]
    stmt = insert_ignore(conn, t.applied_events).returning(t.applied_events.c.event_id)
    claimed = set(conn.execute(stmt, rows).scalars())
    if not claimed:
        return 0
    # 2. Sort the new events into job-wide ones and per-run ones.
    accepted: dict[str, JobAccepted] = {}
    job_cancels: dict[str, tuple[float, int | None]] = {}  # job -> the cancel that counts: (at, seq)
    by_run: dict[str, list[tuple[JobEvent, int | None]]] = {}
    job_tenants: dict[str, str] = {}
    run_keys: dict[str, tuple[str, str]] = {}
    for event_id in sorted(claimed):
        event, seq = batch[event_id], stream_seq(event_id)
        if isinstance(event, JobRejected):
            continue  # never ran: nothing to meter
        if isinstance(event, JobAccepted):
            job_tenants[event.job_id] = event.spec.tenant
            best = accepted.get(event.job_id)
            if best is None or event.at < best.at:
                accepted[event.job_id] = event
        elif isinstance(event, JobCancelled) and event.run_id is None:
            job_tenants.setdefault(event.job_id, event.tenant)
            cancel = job_cancels.get(event.job_id)
            if cancel is None or first_cancel((event.at, seq), cancel):
                job_cancels[event.job_id] = (event.at, seq)
        else:
            job_tenants.setdefault(event.job_id, event.tenant)
            run_keys.setdefault(event.run_id, (event.job_id, event.tenant))  # type: ignore[arg-type]
            by_run.setdefault(event.run_id, []).append((event, seq))  # type: ignore[arg-type]
    # 3. Merge job-wide facts into the job rows.
    jobs = _merge_jobs(conn, t, job_tenants, accepted, job_cancels)
    # 4. Fold run events into run rows; a job-wide event touches every run of its job.
    stubs = {r: {"run_id": r, "job_id": j, "tenant": tn, "gpus": 0} for r, (j, tn) in run_keys.items()}
    runs = claim_rows(conn, t.runs, stubs)
    runs.update(lock_rows(conn, t.runs, t.runs.c.job_id, sorted(set(accepted) | set(job_cancels))))
    changed: dict[str, RunFacts] = {}
    for run_id in sorted(runs):
        facts = facts_from_row(runs[run_id])
        for event, seq in by_run.get(run_id, ()):
            facts = observe(facts, event, seq)
        job = jobs.get(facts.job_id)
        if job is not None and job["cancelled_at"] is not None:
            facts = end_run(facts, job["cancelled_at"], CANCELLED, job["cancelled_seq"])
        changed[run_id] = facts
    write_runs(conn, t, runs, changed, jobs)
    return len(claimed)


def first_cancel(a: tuple[float, int | None], b: tuple[float, int | None]) -> bool:
    """Whether cancel ``(at, seq)`` ``a`` counts before ``b``: the first in log
    order; one without a sequence after any with one, then by time."""

    def key(c: tuple[float, int | None]) -> tuple[int, int, float]:
        return (0, c[1], c[0]) if c[1] is not None else (1, 0, c[0])

    return key(a) < key(b)


def lock_rows(
    conn: sa.Connection, table: sa.Table, column: sa.Column, keys: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """Rows whose ``column`` is in ``keys``, keyed by primary key, locked for update."""
    pk = next(iter(table.primary_key.columns))
    name = pk.name
    rows: dict[str, dict[str, Any]] = {}
    for chunk in chunks(keys):
        stmt = sa.select(table).where(column.in_(chunk)).order_by(pk).with_for_update()
        for row in conn.execute(stmt):
            values = row._asdict()
            rows[values[name]] = values
    return rows


def claim_rows(conn: sa.Connection, table: sa.Table, stubs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Lock the rows keyed by ``stubs``, first inserting (or ignoring) a stub
    row for each that does not exist yet."""
    pk = next(iter(table.primary_key.columns))
    rows = lock_rows(conn, table, pk, sorted(stubs))
    missing = sorted(set(stubs) - set(rows))
    if missing:
        conn.execute(insert_ignore(conn, table), [stubs[key] for key in missing])
        rows.update(lock_rows(conn, table, pk, missing))
    return rows


def _merge_jobs(
    conn: sa.Connection,
    t: LedgerTables,
    tenants: dict[str, str],
    accepted: dict[str, JobAccepted],
    job_cancels: dict[str, tuple[float, int | None]],
) -> dict[str, dict[str, Any]]:
    if not tenants:
        return {}
    rows = claim_rows(conn, t.jobs, {j: {"job_id": j, "tenant": tn} for j, tn in tenants.items()})
    updates = []
    for job_id, old in rows.items():
        row = dict(old)
        event = accepted.get(job_id)
        if event is not None and (row["accepted_at"] is None or event.at < row["accepted_at"]):
            spec = event.spec
            row.update(
                tenant=spec.tenant,
                queue=spec.queue,
                priority_class=spec.priority_class,
                name=spec.name,
                labels=dict(spec.labels),
                roles={r.name: [r.gpu_type, r.gpus] for r in spec.roles},
                gpu_type="+".join(sorted(spec.gpu_types)) or None,
                submitted_at=event.submitted_at,
                accepted_at=event.at,
            )
        cancel = job_cancels.get(job_id)
        if cancel is not None and (
            row["cancelled_at"] is None or first_cancel(cancel, (row["cancelled_at"], row["cancelled_seq"]))
        ):
            row["cancelled_at"], row["cancelled_seq"] = cancel
        rows[job_id] = row
        if row != old:
            updates.append({f"b_{k}": v for k, v in row.items()})
    _update(conn, t.jobs, updates)
    return rows


def write_runs(
    conn: sa.Connection,
    t: LedgerTables,
    rows: dict[str, dict[str, Any]],
    changed: dict[str, RunFacts],
    jobs: dict[str, dict[str, Any]] | None = None,
) -> None:
    """Re-meter the runs in ``changed`` and write back the rows that differ."""
    jobs = dict(jobs or {})
    for chunk in chunks(sorted({f.job_id for f in changed.values()} - set(jobs))):
        for r in conn.execute(sa.select(t.jobs).where(t.jobs.c.job_id.in_(chunk))):
            jobs[r.job_id] = r._asdict()
    checkpoints: dict[str, list[float]] = {}
    failed = sorted(r for r, f in changed.items() if f.outcome and f.outcome.startswith("failed:"))
    for chunk in chunks(failed):
        for r in conn.execute(sa.select(t.checkpoints).where(t.checkpoints.c.run_id.in_(chunk))):
            checkpoints.setdefault(r.run_id, []).append(r.at)
    updates = []
    for run_id, facts in changed.items():
        roles = {
            name: (kind, gpus) for name, (kind, gpus) in ((jobs.get(facts.job_id) or {}).get("roles") or {}).items()
        }
        usage = meter(facts, roles=roles, checkpoints=checkpoints.get(run_id, ()))
        ended = facts.ended_at is not None
        row = {c: getattr(facts, c) for c in FACT_COLUMNS} | {
            "run_id": run_id,
            "job_id": facts.job_id,
            "tenant": facts.tenant,
            "placement": dict(facts.placement),
            "gpus": usage.gpus,
            "gpus_by_type": usage.gpus_by_type,
            "gpu_type": "+".join(sorted(usage.gpus_by_type)) or None,
            "gpu_seconds": usage.gpu_seconds if ended else None,
            "lost_seconds": usage.lost_seconds if ended else None,
            "idle_seconds": usage.idle_seconds if ended else None,
        }
        old = rows[run_id]
        if any(old[k] != v for k, v in row.items()):
            updates.append({f"b_{k}": v for k, v in row.items()})
    _update(conn, t.runs, updates)


def _update(conn: sa.Connection, table: sa.Table, params: list[dict[str, Any]]) -> None:
    """UPDATE many rows by primary key; ``params`` keys are column names prefixed ``b_``."""
    if not params:
        return
    pk = next(iter(table.primary_key.columns))
    values = {c.name: sa.bindparam(f"b_{c.name}") for c in table.columns if c.name != pk.name}
    stmt = sa.update(table).where(pk == sa.bindparam(f"b_{pk.name}")).values(values)
    conn.execute(stmt, params)
