"""How fair a simulation run was: Jain's index against weighted max-min fair shares.

Fairness compares each tenant's share of the GPU-seconds used with its fair
share: the weighted (by entitlement) max-min split of those GPU-seconds,
capped by what the tenant asked for (GPUs x run time of its jobs).  A tenant
that wanted little is not counted as starved.  Jain's index is taken over
received / fair.  Over a whole run in which every job finishes, every tenant
gets about what it asked for, so ``jain_index`` tends to 1; ``jain_contended``
is the same index on the GPUs held at each timeline sample while jobs were
waiting, averaged: the fairness users feel while they queue.
``jain_contended_24h`` sums those samples per day before taking the index, so
gangs too large for a tenant's instantaneous share may take turns.
"""

from __future__ import annotations


def jain(values: list[float]) -> float:
    """Jain's fairness index: 1 when all equal, 1/n when one gets everything."""
    if not values or not any(values):
        return 1.0
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values))


FAIR_PERIOD_S = 24 * 3600.0  # the period of ``jain_contended_24h``


class FairPeriod:
    """Contended samples of one period summed: GPUs held and wanted per tenant, GPUs placed."""

    __slots__ = ("held", "wanted", "placed")

    def __init__(self, held: dict[str, float], wanted: dict[str, float], placed: float = 0.0) -> None:
        self.held, self.wanted, self.placed = held, wanted, placed

    def add(self, held: dict[str, int], wanted: dict[str, int], placed: int) -> None:
        for tenant, w in wanted.items():
            self.held[tenant] = self.held.get(tenant, 0.0) + held.get(tenant, 0)
            self.wanted[tenant] = self.wanted.get(tenant, 0.0) + w
        self.placed += placed

    def jain(self, entitled: dict[str, float]) -> float:
        """Jain's index of GPU-time held against the weighted max-min split of the GPU-time placed in the
        period, capped by what each tenant wanted in it: a tenant may be over its share in one sample and
        under in the next, as indivisible gangs must take turns."""
        fair = water_fill(self.wanted, entitled, self.placed)
        return jain([self.held.get(t, 0.0) / f for t, f in fair.items() if f > 0])


def period_fairness(periods: dict[int, FairPeriod], entitled: dict[str, float]) -> float | None:
    """Mean of :meth:`FairPeriod.jain` over the periods with contention (None: none had any)."""
    if not periods:
        return None
    return round(sum(p.jain(entitled) for p in periods.values()) / len(periods), 4)


def water_fill(demands: dict[str, float], weights: dict[str, float], total: float) -> dict[str, float]:
    """Weighted max-min fair split of ``total``: nobody gets more than it asked for, the rest is shared by weight."""
    fair = dict.fromkeys(demands, 0.0)
    open_ = {t for t, d in demands.items() if d > 0 and weights.get(t, 0) > 0}
    left = total
    while open_ and left > 1e-9:
        wsum = sum(weights[t] for t in open_)
        capped = {t for t in open_ if demands[t] - fair[t] <= left * weights[t] / wsum}
        if not capped:
            for t in open_:
                fair[t] += left * weights[t] / wsum
            break
        for t in capped:
            left -= demands[t] - fair[t]
            fair[t] = demands[t]
        open_ -= capped
    return fair
