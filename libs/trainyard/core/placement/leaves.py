"""How few spines (blocks) and leaves (racks) a gang of equal replicas needs.

The two-level rule: a gang that spills over several leaves goes on the fewest
spines that hold it and, within that many spines, on the fewest leaves; best
fit only breaks ties between placements that are equal on both counts.

Replicas of ``g`` GPUs that fit on one node each are a bin-covering problem
with equal items: a leaf holds ``slots(g)`` of them, whatever else the gang
takes there.  Inside one spine the fewest leaves are therefore the leaves
with the most slots, largest first, until the rest fits in one more.  Across
spines the number of spines is the smallest ``k`` whose ``k`` largest spines
hold the gang, and the fewest leaves over every choice of ``k`` spines is a
small knapsack over (spines used, leaves used) -> replicas covered, solved
exactly here.  Everything reads the per-domain aggregates, never a node.
"""

from __future__ import annotations

from itertools import pairwise

from trainyard.core.placement.topology import Domain, Level, subdomains

Span = tuple[int, int]  # (spines, leaves); smaller is better, compared in that order
State = tuple[tuple[int, int], tuple[tuple[int, int], ...]]  # ((covered, -free GPUs), ((spine, leaves), ...))


def cover(domain: Domain, gpus: int, count: int) -> list[int] | None:
    """Replicas held by the fewest leaves of ``domain`` that hold ``count``: the leaves'
    slots, largest first, running sums; ``None`` when the domain cannot hold ``count``."""
    if domain.level <= Level.RACK:
        got = domain.slots(gpus)
        return [got] if got >= count else None
    racks = domain.children if domain.level is Level.BLOCK else subdomains(domain, Level.RACK)
    slots = sorted((s for r in racks if (s := r.slots(gpus)) > 0), reverse=True)
    sums: list[int] = []
    total = 0
    for s in slots:
        total += s
        sums.append(total)
        if total >= count:
            return sums
    return None


def span(domain: Domain, gpus: int, count: int) -> Span | None:
    """The fewest spines, then the fewest leaves, that hold ``count`` replicas of ``gpus``
    GPUs inside ``domain``; ``None`` when they do not fit."""
    if domain.level <= Level.BLOCK:
        sums = cover(domain, gpus, count)
        return None if sums is None else (1, len(sums))
    chosen = plan(domain, gpus, count)
    if chosen is None:
        return None
    return len(chosen), sum(leaves for _, _, leaves in chosen)


def plan(domain: Domain, gpus: int, count: int) -> list[tuple[Domain, int, int]] | None:
    """For a domain wider than a spine: the spines to use, as ``(spine, replicas, leaves)``.

    Fewest spines first, then fewest leaves (both exact); among plans equal
    on both, the spines with fewer free GPUs (best fit, as far as one state
    per spine and leaf count keeps them), then the first in key order.
    ``None`` when the domain cannot hold ``count`` replicas.
    """
    spines: list[Domain] = []
    reach: list[list[int]] = []  # per spine: replicas its 1, 2, ... largest leaves hold
    for spine in subdomains(domain, Level.BLOCK):
        if spine.slots(gpus) <= 0:
            continue
        sums = cover(spine, gpus, count)
        if sums is None:  # the spine cannot hold the whole gang: every leaf counts
            sums = cover(spine, gpus, spine.slots(gpus))
            assert sums is not None
        spines.append(spine)
        reach.append(sums)
    # 1. The fewest spines: the k largest hold the gang.
    order = sorted(range(len(spines)), key=lambda i: -reach[i][-1])
    held = 0
    k = 0
    for i in order:
        held += reach[i][-1]
        k += 1
        if held >= count:
            break
    else:
        return None
    if k == 1:
        # One spine: the one needing the fewest leaves, then best fit.
        only = min(
            (i for i in range(len(spines)) if reach[i][-1] >= count),
            key=lambda i: (_leaves_for(reach[i], count), spines[i].free, spines[i].key),
        )
        return [(spines[only], count, _leaves_for(reach[only], count))]
    # 2. An upper bound on leaves: the largest leaves of the k largest spines.
    pooled = sorted((b - a for i in order[:k] for a, b in pairwise([0, *reach[i]])), reverse=True)
    bound = 0
    pooled_held = 0
    for s in pooled:
        pooled_held += s
        bound += 1
        if pooled_held >= count:
            break
    # 3. Knapsack over spines in key order: best[j][t] is the best (replicas covered, capped at
    #    count; minus free GPUs of the spines used) with j spines and t leaves, and its picks.
    best: list[list[State | None]] = [[None] * (bound + 1) for _ in range(k + 1)]
    best[0][0] = ((0, 0), ())
    for i, spine in enumerate(spines):
        sums = reach[i]
        for j in range(min(i + 1, k), 0, -1):
            before, after = best[j - 1], best[j]
            for t0 in range(bound):
                state = before[t0]
                if state is None:
                    continue
                (covered, unfree), picks = state
                for leaves, reached in enumerate(sums, 1):
                    t = t0 + leaves
                    if t > bound:
                        break
                    value = (min(covered + reached, count), unfree - spine.free)
                    here = after[t]
                    if here is None or value > here[0]:
                        after[t] = (value, (*picks, (i, leaves)))
    final = next(s for s in best[k] if s is not None and s[0][0] >= count)
    # 4. Replicas per spine: the spines that hold most take all they can, the last the rest.
    ordered = sorted(final[1], key=lambda p: (-reach[p[0]][p[1] - 1], spines[p[0]].key))
    out: list[tuple[Domain, int, int]] = []
    left = count
    for i, leaves in ordered:
        take = min(left, reach[i][leaves - 1])
        left -= take
        out.append((spines[i], take, _leaves_for(reach[i], take)))
    return out


def _leaves_for(sums: list[int], count: int) -> int:
    """How many of the largest leaves hold ``count``, from their running sums."""
    return next(n for n, held in enumerate(sums, 1) if held >= count)
