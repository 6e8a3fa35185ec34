"""Accounting settings: TRAINYARD_LEDGER_URL names the ledger database
(``sqlite:///path`` by default, ``postgresql+psycopg://...`` in production)."""

from trainyard.settings import Settings, load_settings

__all__ = ["Settings", "load_settings"]
