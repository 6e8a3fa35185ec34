"""The ledger's tables (SQLAlchemy Core).

All times are Unix seconds (double precision); all usage columns are
GPU-seconds.  A ``prefix`` lets several ledgers share one database (tests
use a fresh prefix each, operators may use one per cluster).
"""

from __future__ import annotations

from typing import NamedTuple

import sqlalchemy as sa

ID = sa.String(255)


class LedgerTables(NamedTuple):
    metadata: sa.MetaData
    jobs: sa.Table
    runs: sa.Table
    applied_events: sa.Table
    checkpoints: sa.Table


def add_missing_columns(conn: sa.Connection, tables: LedgerTables) -> None:
    """Add columns this version has and an older ledger's tables lack (all
    of them nullable), so a ledger created by an earlier release keeps working."""
    inspector = sa.inspect(conn)
    preparer = conn.dialect.identifier_preparer
    for table in (tables.jobs, tables.runs, tables.applied_events, tables.checkpoints):
        present = {c["name"] for c in inspector.get_columns(table.name)}
        for column in table.columns:
            if column.name not in present:
                kind = column.type.compile(dialect=conn.dialect)
                name, table_name = preparer.quote(column.name), preparer.quote(table.name)
                # PostgreSQL: another process starting at once may add it first.
                guard = "IF NOT EXISTS " if conn.dialect.name == "postgresql" else ""
                conn.execute(sa.text(f"ALTER TABLE {table_name} ADD COLUMN {guard}{name} {kind}"))


def create_tables(metadata: sa.MetaData, engine: sa.Engine) -> None:
    """Create the tables of ``metadata`` that are missing.  Processes that
    start together (admission, placement and the gateway) may each find a
    table missing and create it at once: the one that loses is told the table
    exists, and looks again."""
    try:
        metadata.create_all(engine)
    except sa.exc.DBAPIError:
        metadata.create_all(engine)  # made meanwhile by another process: now found, or a real error again


def build_tables(prefix: str = "") -> LedgerTables:
    if prefix and not prefix.replace("_", "").isalnum():
        raise ValueError(f"table prefix {prefix!r} may hold only letters, digits and '_'")
    metadata = sa.MetaData()
    jobs = sa.Table(
        f"{prefix}jobs",
        metadata,
        sa.Column("job_id", ID, primary_key=True),
        sa.Column("tenant", ID, nullable=False),
        # The columns below stay NULL until the job's JobAccepted is applied.
        sa.Column("queue", ID),
        sa.Column("priority_class", ID),
        sa.Column("gpu_type", ID),  # the job's GPU type; types joined by '+' when roles differ
        sa.Column("name", ID),
        sa.Column("labels", sa.JSON),  # label -> value, from the spec
        sa.Column("roles", sa.JSON),  # role -> [GPU type, GPUs requested]
        sa.Column("submitted_at", sa.Double),
        sa.Column("accepted_at", sa.Double),  # time of the JobAccepted the columns come from
        sa.Column("cancelled_at", sa.Double),  # the job's JobCancelled that counts: first in log order
        sa.Column("cancelled_seq", sa.BigInteger),  # its stream sequence, when known
    )
    runs = sa.Table(
        f"{prefix}runs",
        metadata,
        sa.Column("run_id", ID, primary_key=True),
        sa.Column("job_id", ID, nullable=False, index=True),
        sa.Column("tenant", ID, nullable=False, index=True),
        sa.Column("attempt", sa.Integer),
        sa.Column("cluster", ID),
        sa.Column("gpus", sa.Integer, nullable=False, default=0),
        sa.Column("gpu_type", ID),  # one type, or types joined by '+'; see gpus_by_type
        sa.Column("gpus_by_type", sa.JSON),  # GPU type -> GPUs held
        sa.Column("placement", sa.JSON),  # role -> GPUs, from the earliest JobPlaced
        sa.Column("admitted_at", sa.Double),
        sa.Column("placed_at", sa.Double),
        sa.Column("started_at", sa.Double, index=True),
        sa.Column("ended_at", sa.Double, index=True),  # NULL while the run is open
        sa.Column("outcome", sa.String(64)),  # succeeded | failed:<reason> | cancelled
        sa.Column("ended_seq", sa.BigInteger),  # stream sequence of the event that ended the run, when known
        # Filled when the run ends; NULL while it is open.
        sa.Column("gpu_seconds", sa.Double),
        sa.Column("lost_seconds", sa.Double),
        sa.Column("idle_seconds", sa.Double),
    )
    applied_events = sa.Table(
        f"{prefix}applied_events",
        metadata,
        # The primary key is the exactly-once guard: an event id can be stored once.
        sa.Column("event_id", sa.String(128), primary_key=True),
        sa.Column("event_type", sa.String(32), nullable=False),
    )
    checkpoints = sa.Table(
        f"{prefix}checkpoints",
        metadata,
        sa.Column("run_id", ID, primary_key=True),
        sa.Column("at", sa.Double, primary_key=True),
    )
    return LedgerTables(metadata, jobs, runs, applied_events, checkpoints)
