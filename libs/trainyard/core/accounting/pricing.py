"""Pricing: versioned rate cards and rounding money to the cent.

A rate card is a list of versions.  Each version has an id, the UTC date it
takes effect and a complete price list (price per GPU-hour by GPU type, with
an optional ``"*"`` entry for any type not listed).  A version applies from
00:00 UTC on its ``effective_from`` date until the next version takes effect.

A rate card also says how much of the work lost to a hardware failure of
ours (a run failed with reason ``node_failure``: health isolated its node
after an XID or another fault) is credited back to the tenant:
``hardware_failure_credit`` is ``"full"`` (the default), ``"none"`` or a
fraction from 0 to 1, for the whole card or for one version.

Money is :class:`decimal.Decimal` throughout.  Row costs are rounded with the
largest-remainder method so that rounded rows add up exactly to the rounded
total of their group.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
from collections.abc import Sequence
from decimal import ROUND_DOWN, ROUND_HALF_UP, Decimal
from typing import Any

import msgspec

CENT = Decimal("0.01")
ANY_GPU_TYPE = "*"
#: Run failure reasons that are our hardware's fault: the node was isolated
#: by health (an XID or another fault) or declared lost.
HARDWARE_FAILURES: frozenset[str] = frozenset({"node_failure"})
CREDIT_WORDS = {"full": Decimal(1), "none": Decimal(0)}

Credit = str | float | int  # "full", "none", or a fraction from 0 to 1


class RateCardError(ValueError):
    """A rate card that cannot be used, or usage it does not price."""


class RateCardVersion(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    version: str  # id finance quotes, e.g. "2026-11-a"; SkuPriceId in exports
    effective_from: dt.date  # applies from 00:00 UTC on this date
    prices: dict[str, Decimal]  # GPU type (or "*") -> price per GPU-hour
    hardware_failure_credit: Credit | None = None  # None: the card's

    @property
    def starts_at(self) -> float:
        """The version's first second, as a Unix timestamp."""
        return dt.datetime.combine(self.effective_from, dt.time(), dt.UTC).timestamp()

    def price(self, gpu_type: str) -> Decimal:
        price = self.prices.get(gpu_type, self.prices.get(ANY_GPU_TYPE))
        if price is None:
            listed = ", ".join(sorted(self.prices)) or "nothing"
            raise RateCardError(
                f"rate card version {self.version!r} has no price for GPU type {gpu_type!r} "
                f"(it prices {listed}); add the type or a '*' entry"
            )
        return price


class RateCard(msgspec.Struct, frozen=True, forbid_unknown_fields=True, dict=True):
    versions: list[RateCardVersion]
    currency: str = "USD"  # ISO 4217; BillingCurrency in exports
    hardware_failure_credit: Credit = "full"  # share of work lost to our hardware credited back

    def __post_init__(self) -> None:
        problems = check_rate_card(self)
        if problems:
            raise RateCardError("; ".join(problems))

    @functools.cached_property
    def ordered(self) -> list[RateCardVersion]:
        return sorted(self.versions, key=lambda v: v.effective_from)

    @functools.cached_property
    def _spans(self) -> list[tuple[float, float, RateCardVersion]]:
        """[start, end) of each version, in order; the last one never ends."""
        starts = [v.starts_at for v in self.ordered]
        ends = [*starts[1:], math.inf]
        return list(zip(starts, ends, self.ordered, strict=True))

    def credit_fraction(self, version: RateCardVersion) -> Decimal:
        """Share (0 to 1) of the work lost to a hardware failure credited under ``version``."""
        value = version.hardware_failure_credit
        fraction = parse_credit(self.hardware_failure_credit if value is None else value)
        assert fraction is not None  # checked when the card was read
        return fraction

    def version_at(self, at: float) -> RateCardVersion | None:
        """The version in force at Unix time ``at``; None before the first."""
        for start, end, version in self._spans:
            if start <= at < end:
                return version
        return None

    def slices(self, start: float, end: float) -> list[tuple[float, float, RateCardVersion]]:
        """Split [start, end) where the version in force changes.

        Raises :class:`RateCardError` when part of the span comes before the
        first version, since that usage has no price.
        """
        result: list[tuple[float, float, RateCardVersion]] = []
        if end <= start:
            return result
        spans = self._spans
        if start < spans[0][0]:
            first = spans[0][2]
            raise RateCardError(
                f"usage from {_iso(start)} is before the first rate card version "
                f"({first.version!r}, effective {first.effective_from.isoformat()})"
            )
        for span_start, span_end, version in spans:
            lo = start if start > span_start else span_start
            hi = end if end < span_end else span_end
            if hi > lo:
                result.append((lo, hi, version))
        return result


def _iso(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.UTC).isoformat().replace("+00:00", "Z")


def parse_credit(value: Credit) -> Decimal | None:
    """``"full"`` -> 1, ``"none"`` -> 0, a number from 0 to 1 -> itself; None if none of these."""
    if isinstance(value, str) and value.strip().lower() in CREDIT_WORDS:
        return CREDIT_WORDS[value.strip().lower()]
    if isinstance(value, bool):
        return None
    try:
        fraction = Decimal(str(value).strip())
    except ArithmeticError:
        return None
    return fraction if fraction.is_finite() and 0 <= fraction <= 1 else None


def _credit_problem(where: str, value: Credit | None) -> list[str]:
    if value is None or parse_credit(value) is not None:
        return []
    return [f"{where}hardware_failure_credit {value!r} must be 'full', 'none' or a fraction from 0 to 1, e.g. 0.5"]


def check_rate_card(card: RateCard) -> list[str]:
    """Every problem with a rate card; empty when it is usable."""
    problems: list[str] = _credit_problem("", card.hardware_failure_credit)
    if not card.versions:
        problems.append("a rate card needs at least one version")
    if len(card.currency) != 3 or not card.currency.isalpha() or not card.currency.isupper():
        problems.append(f"currency {card.currency!r} is not an ISO 4217 code such as 'USD'")
    seen_ids: set[str] = set()
    seen_dates: dict[dt.date, str] = {}
    for version in card.versions:
        if version.version in seen_ids:
            problems.append(f"version id {version.version!r} is used twice")
        seen_ids.add(version.version)
        other = seen_dates.get(version.effective_from)
        if other is not None:
            problems.append(
                f"versions {other!r} and {version.version!r} both take effect on {version.effective_from.isoformat()}"
            )
        seen_dates[version.effective_from] = version.version
        problems += _credit_problem(f"version {version.version!r}: ", version.hardware_failure_credit)
        if not version.prices:
            problems.append(f"version {version.version!r} prices nothing")
        for gpu_type, price in version.prices.items():
            if not price.is_finite() or price < 0:
                problems.append(f"version {version.version!r}: price for {gpu_type!r} must be 0 or more, got {price}")
    return problems


def load_rate_card(document: bytes | str | dict[str, Any]) -> RateCard:
    """Read a rate card from JSON (bytes or str) or an already parsed mapping.

    Prices should be written as strings ("2.45") so no binary rounding
    creeps in.  Raises :class:`RateCardError` naming what to fix.
    """
    try:
        if isinstance(document, (bytes, str)):
            return msgspec.json.decode(document, type=RateCard)
        return msgspec.convert(document, type=RateCard, strict=False)
    except msgspec.ValidationError as exc:
        raise RateCardError(f"invalid rate card: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise RateCardError(f"rate card is not valid JSON: {exc}") from exc


def round_total(amount: Decimal) -> Decimal:
    """Round money to the cent, halves away from zero."""
    return amount.quantize(CENT, rounding=ROUND_HALF_UP)


def allocate_cents(exact: Sequence[Decimal], total: Decimal | None = None) -> list[Decimal]:
    """Round each non-negative amount to the cent so the results add up to
    ``total`` (by default the rounded sum of the exact amounts), using the
    largest-remainder method.

    Rows are floored to the cent; the cents left over go one each to the rows
    with the largest remainders, earlier rows first on a tie.  ``total`` must
    lie between the sum of the floors and that sum plus one cent per row.
    """
    floors = [amount.quantize(CENT, rounding=ROUND_DOWN) for amount in exact]
    target = round_total(sum(exact, Decimal(0))) if total is None else total
    left = int((target - sum(floors, Decimal(0))) / CENT)
    if not 0 <= left <= len(exact):
        raise ValueError(f"a total of {target} cannot be shared among {len(exact)} amounts adding up to {sum(exact)}")
    order = sorted(range(len(exact)), key=lambda i: (-(exact[i] - floors[i]), i))
    for i in order[:left]:
        floors[i] += CENT
    return floors
