"""The accounting ledger: GPU usage per run, stored with SQLAlchemy, and the
chargeback exports finance reads.

The JetStream consumer decodes job events and hands them to
:meth:`Ledger.apply` in batches with their stream sequences as event ids.
"""

from trainyard.ledger.chargeback import (
    COLUMNS,
    RateCard,
    RateCardError,
    RateCardVersion,
    chargeback,
    chargeback_rows,
    chargeback_totals,
    encode_rows,
    load_rate_card,
    period_bounds,
)
from trainyard.ledger.ledger import GROUP_KEYS, Ledger
from trainyard.ledger.records import LedgerJob, LedgerRun

__all__ = [
    "COLUMNS",
    "GROUP_KEYS",
    "Ledger",
    "LedgerJob",
    "LedgerRun",
    "RateCard",
    "RateCardError",
    "RateCardVersion",
    "chargeback",
    "chargeback_rows",
    "chargeback_totals",
    "encode_rows",
    "load_rate_card",
    "period_bounds",
]
