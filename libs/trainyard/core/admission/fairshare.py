"""Weighted dominant-resource fair share with decayed history.

A queue's *share* is, over GPU types, the largest fraction of the cluster it
holds now plus what it used recently, divided by its *entitlement* (its
fraction of the cluster from fair-share weights down the tree:
organisation weight among organisations x team weight within the organisation
x queue weight within the team).  The queue with the smallest share goes next.

Recent use is decayed GPU-seconds with a half-life.  A queue that steadily
holds ``x`` GPUs converges to ``x * half_life / ln 2`` decayed GPU-seconds, so
``decayed * ln 2 / half_life`` reads as "GPUs held on average lately" and is
added to the GPUs held now.  The shell keeps the decayed figures up to date
with :func:`decay_usage`; the core never reads a clock.
"""

from __future__ import annotations

import math

from trainyard.core.admission.tree import TreeIndex

LN2 = math.log(2.0)


def decay_usage(prev: float, used_gpu_seconds: float, elapsed: float, half_life: float) -> float:
    """Decayed usage after ``elapsed`` seconds in which ``used_gpu_seconds`` were used.

    The old figure halves every ``half_life`` seconds; the new use is taken as
    spread evenly over the interval and decayed accordingly.
    """
    if half_life <= 0:
        return used_gpu_seconds
    if elapsed <= 0:
        return prev + used_gpu_seconds
    factor: float = 0.5 ** (elapsed / half_life)
    return prev * factor + used_gpu_seconds * (1.0 - factor) * half_life / (elapsed * LN2)


def decay_usage_table(
    prev: dict[str, dict[str, float]], used: dict[str, dict[str, float]], elapsed: float, half_life: float
) -> dict[str, dict[str, float]]:
    """:func:`decay_usage` for every queue and GPU type in either table."""
    out: dict[str, dict[str, float]] = {}
    for queue in sorted(prev.keys() | used.keys()):
        old, new = prev.get(queue, {}), used.get(queue, {})
        out[queue] = {
            t: decay_usage(old.get(t, 0.0), new.get(t, 0.0), elapsed, half_life)
            for t in sorted(old.keys() | new.keys())
        }
    return out


class FairShare:
    """Shares of every queue, kept current as the cycle takes and frees GPUs."""

    __slots__ = ("usage", "history", "scale", "share")

    def __init__(
        self,
        index: TreeIndex,
        usage: list[list[int]],
        capacity: list[int],
        history: dict[str, dict[str, float]],
        half_life: float,
    ) -> None:
        nf = len(index.flavors)
        count = len(index.names)
        per_second = LN2 / half_life if half_life > 0 else 0.0
        self.usage = usage  # the quota state's usage lists, shared
        self.history = [[0.0] * nf for _ in range(count)]  # recent use as average GPUs held
        for name, by_type in history.items():
            n = index.queue_of.get(name)
            if n is None:
                continue
            for t, v in by_type.items():
                i = index.fidx.get(t)
                if i is not None:
                    self.history[n][i] = max(v, 0.0) * per_second
        # 1 / (capacity of the type x entitlement of the queue), 0 for absent types
        self.scale = [
            [1.0 / (capacity[i] * index.entitlement[n]) if capacity[i] > 0 else 0.0 for i in range(nf)]
            for n in range(count)
        ]
        self.share = [0.0] * count
        for n in index.queue_nodes:
            self.update(n)

    def copy(self, usage: list[list[int]]) -> FairShare:
        """A copy over ``usage`` (a copy of the quota state's): the history and scales are shared, read only."""
        new = FairShare.__new__(FairShare)
        new.usage, new.history, new.scale, new.share = usage, self.history, self.scale, list(self.share)
        return new

    def update(self, n: int) -> float:
        """Recompute queue ``n``'s share from its usage."""
        u, h, s = self.usage[n], self.history[n], self.scale[n]
        best = 0.0
        for i in range(len(s)):
            v = (u[i] + h[i]) * s[i]
            if v > best:
                best = v
        self.share[n] = best
        return best

    def share_with(self, n: int, demand: list[tuple[int, int]], sign: int = 1) -> float:
        """Queue ``n``'s share if it took (sign 1) or gave up (sign -1) ``demand``."""
        u, h, s = list(self.usage[n]), self.history[n], self.scale[n]
        for i, d in demand:
            u[i] += sign * d
        return max(((u[i] + h[i]) * s[i] for i in range(len(s))), default=0.0)
