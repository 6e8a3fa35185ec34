"""Quota usage over the tree, and whether a gang fits.

Every node tracks, per GPU type, its *usage* (GPUs held in its subtree) and its
*claim* on its parent: ``max(usage of its children's claims, kept-back quota)``.
For a queue the claim is ``max(regular usage, kept back) + borrow-only usage``,
so best-effort work never sits in the queue's own kept-back quota.  A gang fits
when, after taking it,

1. no node on the path exceeds its nominal quota plus its borrowing limit, and
2. the claims of the root's children fit in the root (the sum of the top-level
   nominal quotas), which is what keeps every lender's kept-back quota free.

Both checks walk only the path from the queue to the root.
"""

from __future__ import annotations

from trainyard.core.admission.tree import TreeIndex
from trainyard.core.reasons import PendingReason

QUOTA = PendingReason.QUOTA
COHORT_EXHAUSTED = PendingReason.COHORT_EXHAUSTED

Demand = list[tuple[int, int]]  # (GPU type number, GPUs) for each type a gang needs


class QuotaState:
    """Usage of every node of one :class:`TreeIndex`; mutated by one cycle only."""

    __slots__ = ("index", "usage", "regular", "borrowed", "claim", "inner")

    def __init__(self, index: TreeIndex) -> None:
        count, nf = len(index.names), len(index.flavors)
        self.index = index
        self.usage = [[0] * nf for _ in range(count)]  # GPUs held in the subtree
        self.regular = [[0] * nf for _ in range(count)]  # queues: GPUs held by ordinary jobs
        self.borrowed = [[0] * nf for _ in range(count)]  # queues: GPUs held by borrow-only jobs
        self.claim = [list(row) for row in index.min_claim]  # claim on the parent
        self.inner = [[0] * nf for _ in range(count)]  # sum of the children's claims
        for n in range(1, count):
            up = index.parent[n]
            for i in range(nf):
                self.inner[up][i] += self.claim[n][i]
        self.claim[0] = list(self.inner[0])

    def copy(self) -> QuotaState:
        """An independent copy (a trial pass changes it and may be thrown away)."""
        new = QuotaState.__new__(QuotaState)
        new.index = self.index
        new.usage = [list(row) for row in self.usage]
        new.regular = [list(row) for row in self.regular]
        new.borrowed = [list(row) for row in self.borrowed]
        new.claim = [list(row) for row in self.claim]
        new.inner = [list(row) for row in self.inner]
        return new

    def check(self, q: int, demand: Demand, borrow_only: bool) -> tuple[PendingReason, int] | None:
        """None if the gang fits; else the reason and the node where it does not."""
        index = self.index
        path = index.paths[q]
        usage, limit, guard, claim, inner = self.usage, index.limit, index.guard, self.claim, self.inner
        for i, d in demand:
            if usage[q][i] + d > limit[q][i]:
                return QUOTA, q
            for n in path[1:-1]:
                if usage[n][i] + d > limit[n][i]:
                    return COHORT_EXHAUSTED, n
            regular, borrowed = self.regular[q][i], self.borrowed[q][i]
            if borrow_only:
                borrowed += d
            else:
                regular += d
            g = guard[q][i]
            delta = (regular if regular > g else g) + borrowed - claim[q][i]
            for n in path[1:-1]:
                if delta <= 0:
                    break
                new = inner[n][i] + delta
                g = guard[n][i]
                delta = (new if new > g else g) - claim[n][i]
            if delta > 0 and inner[0][i] + delta > limit[0][i]:
                return COHORT_EXHAUSTED, 0
        return None

    def take(self, q: int, demand: Demand, borrow_only: bool, sign: int = 1) -> None:
        """Add (sign 1) or remove (sign -1) a gang's GPUs at queue ``q``."""
        index = self.index
        path = index.paths[q]
        guard, claim, inner, usage = index.guard, self.claim, self.inner, self.usage
        for i, d in demand:
            d *= sign
            for n in path:
                usage[n][i] += d
            if borrow_only:
                self.borrowed[q][i] += d
            else:
                self.regular[q][i] += d
            regular = self.regular[q][i]
            g = guard[q][i]
            new = (regular if regular > g else g) + self.borrowed[q][i]
            delta = new - claim[q][i]
            claim[q][i] = new
            for n in path[1:]:
                if delta == 0:
                    break
                inner[n][i] += delta
                value = inner[n][i]
                g = guard[n][i]
                new = value if value > g else g
                delta = new - claim[n][i]
                claim[n][i] = new

    def within_nominal(self, q: int, demand: Demand) -> bool:
        """Whether the gang stays inside the queue's own nominal quota."""
        regular, nominal = self.regular[q], self.index.nominal[q]
        return all(regular[i] + d <= nominal[i] for i, d in demand)

    def borrowing(self, q: int, i: int) -> bool:
        """Whether queue ``q`` holds more of type ``i`` than its nominal quota."""
        return self.usage[q][i] > self.index.nominal[q][i]


def quota_violations(index: TreeIndex, holders: list[tuple[int, Demand, bool]]) -> list[str]:
    """Every quota limit that ``holders`` (queue node, demand, borrow-only) break; for invariant checks."""
    state = QuotaState(index)
    for q, demand, borrow_only in holders:
        state.take(q, demand, borrow_only)
    problems = []
    for n in range(1, len(index.names)):
        for i, f in enumerate(index.flavors):
            if state.usage[n][i] > index.limit[n][i]:
                problems.append(
                    f"{index.names[n]} holds {state.usage[n][i]} {f}, more than its nominal quota plus borrowing "
                    f"limit {index.limit[n][i]}"
                )
    for i, f in enumerate(index.flavors):
        if state.claim[0][i] > index.limit[0][i]:
            problems.append(
                f"{f}: usage plus kept-back quota {state.claim[0][i]} exceeds the tree's {index.limit[0][i]}"
            )
    return problems
