"""Compacted snapshots of a projection, kept in the ledger database.

The JOBS stream keeps its messages for a limited time
(:mod:`trainyard.bus.streams`), so a projection rebuilt after Redis is lost
cannot start from the stream's first message: it starts from the newest
snapshot (the projection's state through a stream sequence, see
:mod:`trainyard.store.snapshot`) and replays the messages after it.  One row
per projection: a newer snapshot replaces the one before.
"""

from __future__ import annotations

from typing import NamedTuple

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from trainyard.ledger.ledger import Ledger
from trainyard.ledger.schema import create_tables


class Snapshot(NamedTuple):
    """The projection through stream sequence ``seq``, read at ``taken_at``,
    packed as :mod:`trainyard.store.snapshot` packs it."""

    seq: int
    taken_at: float
    data: bytes


class SnapshotStore:
    """The newest snapshot of each projection, in the ledger database at
    ``url`` (SQLite or PostgreSQL, as :class:`~trainyard.ledger.Ledger`)."""

    def __init__(self, url: str, *, prefix: str = "") -> None:
        self._ledger = Ledger(url, prefix=prefix)
        self.engine = self._ledger.engine
        self._created = False
        self.metadata = sa.MetaData()
        self.table = sa.Table(
            f"{prefix}projection_snapshots",
            self.metadata,
            sa.Column("projection", sa.String(32), primary_key=True),
            sa.Column("seq", sa.BigInteger, nullable=False),  # the stream sequence it holds everything through
            sa.Column("taken_at", sa.Double, nullable=False),
            sa.Column("data", sa.LargeBinary, nullable=False),
        )

    def create_schema(self) -> None:
        create_tables(self.metadata, self.engine)
        self._created = True

    def _ensure_schema(self) -> None:
        if not self._created:  # a projector may read before the service that writes snapshots has started
            self.create_schema()

    def drop_schema(self) -> None:
        self.metadata.drop_all(self.engine)

    def close(self) -> None:
        self._ledger.close()

    def put(self, projection: str, snapshot: Snapshot) -> bool:
        """Keep ``snapshot`` as ``projection``'s newest, unless the one kept
        already holds a later sequence; returns whether it was kept."""
        self._ensure_schema()
        row = {"projection": projection, "seq": snapshot.seq, "taken_at": snapshot.taken_at, "data": snapshot.data}
        with self.engine.begin() as conn:
            dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
            stmt = dialect.insert(self.table).values(row)
            stmt = stmt.on_conflict_do_update(
                index_elements=["projection"],
                set_={c: stmt.excluded[c] for c in ("seq", "taken_at", "data")},
                where=self.table.c.seq <= stmt.excluded.seq,
            )
            return conn.execute(stmt.returning(self.table.c.seq)).first() is not None

    def get(self, projection: str) -> Snapshot | None:
        self._ensure_schema()
        t = self.table
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(t.c.seq, t.c.taken_at, t.c.data).where(t.c.projection == projection)).first()
        return None if row is None else Snapshot(row.seq, row.taken_at, bytes(row.data))
