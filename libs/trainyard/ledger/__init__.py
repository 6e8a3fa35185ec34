"""The accounting ledger as its readers see it: GPU usage per run, stored
with SQLAlchemy, and the chargeback exports finance reads.

The accounting service writes it (``trainyard_accounting.writer``: job events
applied in batches, their stream sequences as event ids); the gateway, the
console, the finance commands and the reports read it here.
"""

from trainyard.ledger.chargeback import (
    COLUMNS,
    ChargebackSummary,
    RateCard,
    RateCardError,
    RateCardVersion,
    chargeback,
    chargeback_rows,
    chargeback_summary,
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
    "ChargebackSummary",
    "chargeback_rows",
    "chargeback_summary",
    "chargeback_totals",
    "encode_rows",
    "load_rate_card",
    "period_bounds",
]
