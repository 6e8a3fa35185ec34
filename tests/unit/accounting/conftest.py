"""Fixtures for the accounting tests: the database URLs every ledger test runs
against, and a fresh ledger per test.

SQLite (in the test's tmp_path) always; PostgreSQL too when
TRAINYARD_TEST_POSTGRES_URL is set, e.g.
``postgresql+psycopg://postgres@127.0.0.1:5432/test``.  When it is set and the
server cannot be reached the tests fail: a configured database that is down
is a broken environment, not a reason to skip.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from trainyard_accounting.writer import LedgerWriter

POSTGRES_ENV = "TRAINYARD_TEST_POSTGRES_URL"


def database_kinds() -> list[str]:
    kinds = ["sqlite"]
    if os.environ.get(POSTGRES_ENV):
        kinds.append("postgresql")
    return kinds


def _postgres_url() -> str:
    url = os.environ[POSTGRES_ENV]
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("select 1"))
    except Exception as exc:  # noqa: BLE001 - any failure to connect fails the test
        pytest.fail(f"{POSTGRES_ENV}={url} is set but PostgreSQL cannot be reached: {exc}", pytrace=False)
    finally:
        engine.dispose()
    return url


@pytest.fixture(params=database_kinds())
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database URL for a ledger: SQLite in tmp_path, or the PostgreSQL
    named by TRAINYARD_TEST_POSTGRES_URL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    return _postgres_url()


@pytest.fixture
def make_ledger(ledger_url: str) -> Iterator[Callable[[], LedgerWriter]]:
    """Make ledgers with fresh tables (a unique table prefix), dropped after the test."""
    made: list[LedgerWriter] = []

    def make() -> LedgerWriter:
        ledger = LedgerWriter(ledger_url, prefix=f"t{uuid.uuid4().hex[:12]}_")
        ledger.create_schema()
        made.append(ledger)
        return ledger

    yield make
    for ledger in made:
        ledger.drop_schema()
        ledger.close()


@pytest.fixture
def ledger(make_ledger: Callable[[], LedgerWriter]) -> LedgerWriter:
    return make_ledger()
