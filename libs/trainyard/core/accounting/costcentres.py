"""Cost centres: which finance cost centre each tenant's usage is booked to.

A cost-centre map is a versioned document (YAML or JSON once parsed)::

    version: "2026-11"
    cost_centres:
      acme: CC-1001
      globex: CC-2040

Tenants not listed are exported as ``unassigned``.  Pure: the caller reads
the file.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from trainyard.core.accounting.pricing import RateCardError


class CostCentres(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    cost_centres: dict[str, str]  # tenant -> cost centre
    version: str = ""  # id of this revision of the map, for the audit trail


def load_cost_centres(document: Mapping[str, Any] | None) -> dict[str, str]:
    """Tenant -> cost centre from a parsed document; raises
    :class:`RateCardError` naming what to fix.  ``None`` (an empty file)
    is an empty map."""
    if document is None:
        return {}
    try:
        parsed = msgspec.convert(document, type=CostCentres, strict=False)
    except msgspec.ValidationError as exc:
        raise RateCardError(f"invalid cost-centre map: {exc}") from exc
    blank = sorted(t for t, c in parsed.cost_centres.items() if not t.strip() or not c.strip())
    if blank:
        raise RateCardError(f"cost-centre map: tenants {blank} have an empty name or cost centre")
    return dict(sorted(parsed.cost_centres.items()))
