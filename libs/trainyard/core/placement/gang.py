"""Fit one gang, all replicas of all roles or nothing, into the tightest domain.

The search walks the levels tightest first (node, NVLink domain, rack, block,
zone, cluster) up to the widest level the job allows.  At each level it lists
the domains whose aggregates say the gang fits, best fit first, and packs the
gang into them in turn; the first that takes every replica wins.  From the
block level up, domains are ranked by the two-level rule first (fewest spines,
then fewest leaves; see leaves.py) and by best fit after.  Inside the chosen
domain, roles with their own constraint (trainers in one NVLink domain) are
placed first, in a sub-domain of their level; the rest of the gang fills the
domain top-down: across spines as the two-level plan says, and inside a spine
the leaves with the most room first until one leaf holds the rest, best fit.

A failed try gives back everything it took, so the tree is unchanged unless a
placement is returned.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from trainyard.core.placement.leaves import Span, plan, span
from trainyard.core.placement.scoring import FitKey, best_fit_key, spill_key
from trainyard.core.placement.topology import LEVEL_OF, Domain, Level, Node, Topology
from trainyard.core.reasons import PendingReason
from trainyard.domain.job import JobSpec
from trainyard.events.jobs import ReplicaPlacement


class Demand:
    """The replicas of one role: ``count`` x ``gpus`` GPUs of ``gpu_type``."""

    __slots__ = ("role_index", "role", "gpu_type", "gpus", "count", "level", "required")

    def __init__(
        self, role_index: int, role: str, gpu_type: str, gpus: int, count: int, level: Level | None, required: bool
    ) -> None:
        self.role_index = role_index
        self.role = role
        self.gpu_type = gpu_type
        self.gpus = gpus
        self.count = count
        self.level = level  # the role's own constraint, if any
        self.required = required


Assignment = tuple[int, str, Node, list[int]]  # (role index, role, node, GPU indices)


def demands_of(spec: JobSpec) -> list[Demand]:
    out = []
    for i, role in enumerate(spec.roles):
        level = LEVEL_OF[role.topology.level] if role.topology is not None else None
        required = bool(role.topology is not None and role.topology.required)
        out.append(Demand(i, role.name, role.gpu_type, role.gpus_per_replica, role.replicas, level, required))
    return out


def widest_level(spec: JobSpec) -> Level:
    """The widest domain the whole gang may span."""
    if spec.topology is not None and spec.topology.required:
        return LEVEL_OF[spec.topology.level]
    return Level.CLUSTER


Need = tuple[int, tuple[tuple[int, int], ...]]  # (total GPUs, ((GPUs per replica, replicas), ...))


def need_of(demands: list[Demand]) -> Need:
    by_size: dict[int, int] = {}
    for d in demands:
        by_size[d.gpus] = by_size.get(d.gpus, 0) + d.count
    return sum(d.gpus * d.count for d in demands), tuple(sorted(by_size.items()))


def fits(domain: Domain, demands: list[Demand] | Need) -> bool:
    """Whether the aggregates allow the demands (all of one GPU type) in ``domain``."""
    total, sizes = demands if isinstance(demands, tuple) else need_of(demands)
    if total > domain.free:
        return False
    return all(domain.slots(g) >= n for g, n in sizes)


def fitting(root: Domain, level: Level, demands: list[Demand]) -> Iterator[Domain]:
    """Domains at ``level`` under ``root`` that the demands fit, pruning whole subtrees."""
    return _fitting(root, level, need_of(demands))


def _fitting(root: Domain, level: Level, need: Need) -> Iterator[Domain]:
    if not fits(root, need):
        return
    if root.level == level:
        yield root
        return
    if root.level < level or isinstance(root, Node):
        return
    for child in root.children:
        if level is Level.NVLINK and isinstance(child, Node):
            continue  # single nodes are searched at the node level
        yield from _fitting(child, level, need)


def fit_gang(
    topo: Topology, spec: JobSpec, limit: int = 32, within: tuple[Level, str] | None = None
) -> list[ReplicaPlacement] | None:
    """Place the whole gang and return its replicas in rank order, or ``None``.

    ``within`` restricts the gang to one domain (used by preemption).
    """
    demands = demands_of(spec)
    by_type: dict[str, list[Demand]] = {}
    for d in demands:
        by_type.setdefault(d.gpu_type, []).append(d)
    roots: dict[str, Domain] = {}
    for gpu_type in by_type:
        tree = topo.trees.get(gpu_type)
        if tree is None:
            return None
        root = tree.root if within is None else tree.levels[within[0]].get(within[1])
        if root is None:
            return None
        roots[gpu_type] = root
    widest = min(widest_level(spec), within[0]) if within is not None else widest_level(spec)
    primary = min(by_type)
    for level in Level:
        if level > widest:
            break
        if level is not Level.NODE and any(
            sum(d.gpus * d.count for d in ds) > topo.trees[t].largest.get(level, 0) for t, ds in by_type.items()
        ):
            continue  # no domain at this level is large enough, even empty
        for candidate in _candidates(topo, roots, by_type, primary, level, limit):
            got = _pack(topo, candidate, demands, limit)
            if got is not None:
                return rank_order(got)
    return None


def _candidates(
    topo: Topology, roots: dict[str, Domain], by_type: dict[str, list[Demand]], primary: str, level: Level, limit: int
) -> Iterable[dict[str, Domain]]:
    need = {t: sum(d.gpus * d.count for d in ds) for t, ds in by_type.items()}
    if level is Level.NODE:
        if len(by_type) > 1:
            return []
        node = _best_node(roots[primary], need[primary])
        return [{primary: node}] if node is not None else []
    found: list[tuple[FitKey, dict[str, Domain]]] = []
    primary_need = need_of(by_type[primary])
    for domain in _fitting(roots[primary], level, primary_need):
        group = {primary: domain}
        left, whole, key = best_fit_key(domain, need[primary])
        for t in by_type:
            if t == primary:
                continue
            other = topo.trees[t].levels[level].get(domain.key)
            if other is None or not fits(other, by_type[t]):
                break
            group[t] = other
            left, whole = left + other.free - need[t], whole + other.whole
        else:
            found.append(((left, whole, key), group))
    found.sort(key=lambda f: f[0])
    if level >= Level.BLOCK and len(found) > 1:
        return _two_level_order(topo, found, primary, primary_need, level, limit)
    return [g for _, g in found[:limit]]


def _two_level_order(
    topo: Topology, found: list[tuple[FitKey, dict[str, Domain]]], primary: str, need: Need, level: Level, limit: int
) -> Iterator[dict[str, Domain]]:
    """Candidates (sorted best fit first) by two-level rank, then best fit.

    A spine cannot do better than one spine and the leaves that the largest
    leaf's worth of replicas would need, so the first candidate in best-fit
    order to reach that floor is the best, and the others are ranked only if
    packing it fails.
    """
    floor: Span | None = None
    if level is Level.BLOCK:
        total, sizes = need
        gpus, count = sizes[0] if len(sizes) == 1 else (1, total)
        per_leaf = topo.trees[primary].largest[Level.RACK] // gpus
        floor = (1, -(-count // per_leaf)) if per_leaf else None
        for i, (_, group) in enumerate(found):
            if _span_of(group[primary], need) == floor:
                yield group
                found = found[:i] + found[i + 1 :]
                limit -= 1
                break
    ranked = sorted(((_span_of(g[primary], need), score), g) for score, g in found)
    yield from (g for _, g in ranked[:limit])


def _span_of(domain: Domain, need: Need) -> Span:
    """The two-level rank of a candidate domain: (spines, leaves) the demand needs in it.

    Exact for one replica size; for mixed sizes, the leaves that the gang's GPUs
    would need if any GPU could go anywhere (a lower bound, to rank by).
    """
    total, sizes = need
    gpus, count = sizes[0] if len(sizes) == 1 else (1, total)
    ranked = span(domain, gpus, count)
    assert ranked is not None, "the aggregates said the demand fits"
    return ranked


def _best_node(root: Domain, need: int) -> Node | None:
    """The node with the fewest free GPUs that still holds ``need``, in the busiest domains."""
    hist = root.hist
    k = next((k for k in range(need, len(hist)) if hist[k]), None)
    if k is None:
        return None
    domain = root
    while not isinstance(domain, Node):
        domain = min((c for c in domain.children if c.hist[k]), key=lambda c: best_fit_key(c, need))
    return domain


def _pack(topo: Topology, roots: dict[str, Domain], demands: list[Demand], limit: int) -> list[Assignment] | None:
    """Place every demand inside ``roots``; on failure nothing stays taken."""
    constrained = sorted(
        (d for d in demands if d.level is not None and d.level < roots[d.gpu_type].level),
        key=lambda d: (d.level, -d.gpus * d.count, d.role_index),
    )
    loose = [d for d in demands if d not in constrained]
    budget = [4 * limit]  # packing attempts left, so backtracking stays bounded
    return _pack_constrained(topo, roots, constrained, loose, limit, budget)


def _pack_constrained(
    topo: Topology,
    roots: dict[str, Domain],
    constrained: list[Demand],
    loose: list[Demand],
    limit: int,
    budget: list[int],
) -> list[Assignment] | None:
    if not constrained:
        return _fill_all(topo, roots, loose)
    dem, rest = constrained[0], constrained[1:]
    root = roots[dem.gpu_type]
    assert dem.level is not None
    subs = sorted(fitting(root, dem.level, [dem]), key=lambda s: best_fit_key(s, dem.gpus * dem.count))
    if dem.level is Level.NVLINK:
        node = _best_node(root, dem.gpus * dem.count)  # one node is also one NVLink domain
        if node is not None:
            subs = sorted([*subs, node], key=lambda s: best_fit_key(s, dem.gpus * dem.count))
    options: list[Domain] = subs[:limit]
    if not dem.required:
        options.append(root)  # a preference may fall back to anywhere in the gang's domain
    for option in options:
        if budget[0] <= 0:
            break
        budget[0] -= 1
        got = _fill(topo, option, dem.gpus, dem.count, dem)
        if len(got) == dem.count:
            tail = _pack_constrained(topo, roots, rest, loose, limit, budget)
            if tail is not None:
                return got + tail
        undo(topo, got)
    return None


def _fill_all(topo: Topology, roots: dict[str, Domain], demands: list[Demand]) -> list[Assignment] | None:
    taken: list[Assignment] = []
    for dem in sorted(demands, key=lambda d: (-d.gpus, d.role_index)):  # largest replicas first
        got = _fill(topo, roots[dem.gpu_type], dem.gpus, dem.count, dem)
        taken.extend(got)
        if len(got) < dem.count:
            undo(topo, taken)
            return None
    return taken


def _fill(topo: Topology, domain: Domain, gpus: int, count: int, dem: Demand) -> list[Assignment]:
    """Place ``count`` replicas of ``gpus`` GPUs in ``domain``, top-down; fewer only when
    the domain cannot hold them all.

    Wider than a spine, the two-level plan picks the spines and how many
    replicas each takes.  Inside a spine (and below) the child that holds the
    rest best takes all of it; when none can, the child with the most room
    takes what it can, which uses the fewest children.
    """
    if domain.level > Level.BLOCK:
        chosen = plan(domain, gpus, count)
        if chosen is None:
            return []
        spread: list[Assignment] = []
        for spine, replicas, _ in chosen:
            spread.extend(_fill(topo, spine, gpus, replicas, dem))
        return spread
    if isinstance(domain, Node):
        out: list[Assignment] = []
        while len(out) < count and len(domain.free_gpus) >= gpus:
            indices = domain.free_gpus[:gpus]
            topo.take(domain, indices)
            out.append((dem.role_index, dem.role, domain, indices))
        return out
    slots = {c.key: c.slots(gpus) for c in domain.children}
    kids = [c for c in domain.children if slots[c.key] > 0]
    out = []
    remaining = count
    while remaining > 0 and kids:
        holders = [c for c in kids if slots[c.key] >= remaining]
        if holders:
            child = min(holders, key=lambda c: best_fit_key(c, remaining * gpus))
        else:
            child = min(kids, key=lambda c: spill_key(c, gpus))
        kids.remove(child)
        got = _fill(topo, child, gpus, remaining, dem)
        out.extend(got)
        remaining -= len(got)
    return out


def undo(topo: Topology, taken: list[Assignment]) -> None:
    for _, _, node, gpus in taken:
        topo.give(node, gpus)


def rank_order(taken: list[Assignment]) -> list[ReplicaPlacement]:
    """Ranks role by role; within a role, by zone, block, rack, NVLink domain and node,
    so consecutive ranks share an NVLink domain or a leaf switch."""
    ordered = sorted(taken, key=lambda a: (a[0], a[2].path, a[3]))
    replica_of: dict[int, int] = {}
    out = []
    for rank, (role_index, role, node, gpus) in enumerate(ordered):
        replica = replica_of.get(role_index, 0)
        replica_of[role_index] = replica + 1
        out.append(ReplicaPlacement(role=role, replica=replica, rank=rank, node_id=node.key, gpus=list(gpus)))
    return out


def why_not(topo: Topology, spec: JobSpec) -> PendingReason:
    """The reason a gang that ``fit_gang`` refused is waiting."""
    need: dict[str, int] = {}
    for role in spec.roles:
        need[role.gpu_type] = need.get(role.gpu_type, 0) + role.gpus
    widest = widest_level(spec)
    for gpu_type, n in sorted(need.items()):
        tree = topo.trees.get(gpu_type)
        if tree is None:
            return PendingReason.NO_CAPACITY_OF_TYPE
        if n > topo.capacity_by_type.get(gpu_type, 0):
            return PendingReason.GANG_LARGER_THAN_CLUSTER
        if widest < Level.CLUSTER:
            largest = max((d.capacity for d in tree.domains(widest)), default=0)
            if widest is Level.NVLINK:
                largest = max(largest, tree.width)  # a node is its own NVLink domain
            if largest < n:
                return PendingReason.GANG_LARGER_THAN_DOMAIN
    for gpu_type, n in sorted(need.items()):
        if n > topo.trees[gpu_type].root.free:
            return PendingReason.INSUFFICIENT_GPUS
    constrained = widest < Level.CLUSTER or any(r.topology is not None and r.topology.required for r in spec.roles)
    return PendingReason.TOPOLOGY if constrained else PendingReason.FRAGMENTED
