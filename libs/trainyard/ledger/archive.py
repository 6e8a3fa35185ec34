"""The job archive: finished jobs after they leave the Redis projection.

The JOBS projection forgets a finished job once its retention has passed
(:mod:`trainyard.store.retention`); just before, the sweeper writes the job's
record here, so ``trainyard job ID``, ``trainyard jobs --all`` and the REST
and console reads still find it.  One row per job: the record as the
projection held it (the JSON of :class:`~trainyard.core.lifecycle.JobRecord`)
plus the columns a list filters and orders by.  Writing a job again replaces
its row with the same values, so a sweep that stopped half-way and runs again
changes nothing.  The table lives in the ledger's database but is no part of
usage: the ledger's runs and jobs (what finance exports read) are not touched.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from trainyard.core.lifecycle import TERMINAL, JobRecord
from trainyard.ledger.ledger import Ledger
from trainyard.ledger.schema import ID, create_tables

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(JobRecord).decode


def _record(row: Any) -> JobRecord:
    record = _decode(row.record)
    return record if row.spec is None else msgspec.structs.replace(record, spec=msgspec.Raw(row.spec.encode()))


def archive_table(metadata: sa.MetaData, prefix: str = "") -> sa.Table:
    return sa.Table(
        f"{prefix}job_archive",
        metadata,
        sa.Column("job_id", ID, primary_key=True),
        sa.Column("tenant", ID, nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("order_key", sa.BigInteger, nullable=False),  # its score in the projection's lists: they sort by it
        sa.Column("finished_at", sa.Double),
        sa.Column("record", sa.Text, nullable=False),  # the JobRecord as JSON, but its spec
        sa.Column("spec", sa.Text),  # the spec as the JobAccepted event carried it (None: rejected)
        sa.Index(f"{prefix}job_archive_tenant_order", "tenant", "order_key"),
        sa.Index(f"{prefix}job_archive_order", "order_key"),
    )


class JobArchive:
    """Finished jobs' records in the ledger database at ``url`` (SQLite or
    PostgreSQL, as :class:`~trainyard.ledger.Ledger`)."""

    def __init__(self, url: str, *, prefix: str = "") -> None:
        self._ledger = Ledger(url, prefix=prefix)  # its engine and connection settings
        self.engine = self._ledger.engine
        self.metadata = sa.MetaData()
        self.table = archive_table(self.metadata, prefix)

    def create_schema(self) -> None:
        create_tables(self.metadata, self.engine)

    def drop_schema(self) -> None:
        self.metadata.drop_all(self.engine)

    def close(self) -> None:
        self._ledger.close()

    def put(self, records: Sequence[JobRecord], places: Mapping[str, int] | None = None) -> int:
        """Store finished jobs (one transaction); a job already stored gets
        this record.  ``places``: job id -> its score in the projection's
        lists (the order it was accepted in, which a job requeued at the head
        of its queue no longer holds), so a list of both reads them in one
        order; the job's order where not given.  Raises ValueError, storing
        nothing, for a job that has not finished: only a finished job never
        changes again."""
        unfinished = [r.job_id for r in records if r.status not in TERMINAL]
        if unfinished:
            raise ValueError(f"only finished jobs are archived; not finished: {unfinished[:5]}")
        if not records:
            return 0
        rows = [
            {
                "job_id": r.job_id,
                "tenant": r.tenant,
                "status": r.status,
                "order_key": (places or {}).get(r.job_id, r.order),
                "finished_at": r.finished_at,
                "record": _encode(msgspec.structs.replace(r, spec=None)).decode(),
                "spec": None if r.spec is None else bytes(r.spec).decode(),
            }
            for r in {r.job_id: r for r in records}.values()
        ]
        with self.engine.begin() as conn:
            dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
            stmt = dialect.insert(self.table)
            excluded = stmt.excluded
            conn.execute(
                stmt.on_conflict_do_update(
                    index_elements=["job_id"],
                    set_={
                        c: getattr(excluded, c)
                        for c in ("tenant", "status", "order_key", "finished_at", "record", "spec")
                    },
                ),
                rows,
            )
        return len(rows)

    def get(self, job_id: str) -> JobRecord | None:
        t = self.table
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(t.c.record, t.c.spec).where(t.c.job_id == job_id)).first()
        return None if row is None else _record(row)

    def list(
        self,
        tenant: str | None = None,
        status: str | None = None,
        limit: int = 100,
        newest_first: bool = True,
        after: tuple[float, str] | None = None,
    ) -> builtins.list[JobRecord]:
        """Up to ``limit`` archived jobs, newest first (or oldest), of one
        tenant or all, of one status or any: :meth:`placed` without the places."""
        return [record for _, record in self.placed(tenant, status, limit, newest_first, after)]

    def placed(
        self,
        tenant: str | None = None,
        status: str | None = None,
        limit: int = 100,
        newest_first: bool = True,
        after: tuple[float, str] | None = None,
    ) -> builtins.list[tuple[tuple[float, str], JobRecord]]:
        """Up to ``limit`` archived jobs with their places ``(score, job id)``
        in the projection's lists, in that order (newest first, or oldest);
        ``after``: only jobs past this place, as a page of those lists goes on."""
        if limit <= 0:
            return []
        t = self.table
        stmt = sa.select(t.c.order_key, t.c.job_id, t.c.record, t.c.spec)
        if tenant:
            stmt = stmt.where(t.c.tenant == tenant)
        if status is not None:
            stmt = stmt.where(t.c.status == status)
        if after is not None:
            score, job_id = after
            if newest_first:
                past = sa.or_(t.c.order_key < score, sa.and_(t.c.order_key == score, t.c.job_id < job_id))
            else:
                past = sa.or_(t.c.order_key > score, sa.and_(t.c.order_key == score, t.c.job_id > job_id))
            stmt = stmt.where(past)
        order = (t.c.order_key.desc(), t.c.job_id.desc()) if newest_first else (t.c.order_key, t.c.job_id)
        with self.engine.connect() as conn:
            rows = conn.execute(stmt.order_by(*order).limit(limit))
            return [((float(row.order_key), row.job_id), _record(row)) for row in rows]

    def count(self) -> int:
        with self.engine.connect() as conn:
            return conn.scalar(sa.select(sa.func.count()).select_from(self.table)) or 0
