"""Accounting core: metering runs into usage intervals, and pricing them.

Pure functions over plain values; the ledger (``trainyard.ledger``) stores
what they compute.
"""

from trainyard.core.accounting.costcentres import CostCentres, load_cost_centres
from trainyard.core.accounting.metering import (
    CANCELLED,
    FAILED,
    SUCCEEDED,
    UNKNOWN_GPU_TYPE,
    RunFacts,
    UsageInterval,
    end_run,
    fold_run,
    gpus_held,
    meter,
    meter_run,
    observe,
    outcome_of,
    overlap,
    role_gpus,
)
from trainyard.core.accounting.pricing import (
    RateCard,
    RateCardError,
    RateCardVersion,
    allocate_cents,
    check_rate_card,
    load_rate_card,
    round_total,
)

__all__ = [
    "CANCELLED",
    "CostCentres",
    "FAILED",
    "SUCCEEDED",
    "UNKNOWN_GPU_TYPE",
    "RateCard",
    "RateCardError",
    "RateCardVersion",
    "RunFacts",
    "UsageInterval",
    "allocate_cents",
    "check_rate_card",
    "end_run",
    "fold_run",
    "gpus_held",
    "load_cost_centres",
    "load_rate_card",
    "meter",
    "meter_run",
    "observe",
    "outcome_of",
    "overlap",
    "role_gpus",
    "round_total",
]
