"""The cluster as a tree: zone -> block -> rack -> NVLink domain -> node -> GPU.

There is one tree per GPU type.  Every domain keeps aggregates of its
subtree (free GPUs, a histogram of nodes by free-GPU count, whole free nodes),
kept current on every take and give, so a question such as "how many 8-GPU
replicas fit in this rack" costs a few additions instead of a scan of nodes.

The tree is the placement cycle's own working copy: ``take`` and ``give``
mutate it, and callers undo what they tried and did not keep.  Nodes that are
not schedulable are left out entirely, so they never take work.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator
from typing import cast

from trainyard.domain.job import TopologyLevel
from trainyard.domain.node import NodeInfo


class Level(enum.IntEnum):
    """Tree levels, tightest first; a larger value is a wider domain."""

    NODE = 0
    NVLINK = 1
    RACK = 2
    BLOCK = 3
    ZONE = 4
    CLUSTER = 5


LEVEL_OF: dict[TopologyLevel, Level] = {
    TopologyLevel.NVLINK: Level.NVLINK,
    TopologyLevel.RACK: Level.RACK,
    TopologyLevel.BLOCK: Level.BLOCK,
    TopologyLevel.ZONE: Level.ZONE,
}


class Domain:
    """One domain of one GPU type's tree with aggregates over its subtree."""

    __slots__ = ("key", "level", "parent", "children", "free", "hist", "capacity", "whole", "node_count")

    def __init__(self, key: str, level: Level, parent: Domain | None, width: int) -> None:
        self.key = key  # unique within the tree, e.g. "z1/b2/r7"
        self.level = level
        self.parent = parent
        self.children: list[Domain] = []  # sorted by key once the tree is built
        self.free = 0  # free GPUs in the subtree
        self.hist = [0] * (width + 1)  # hist[k]: nodes in the subtree with exactly k free GPUs
        self.capacity = 0  # GPUs of schedulable nodes in the subtree
        self.whole = 0  # nodes in the subtree with every GPU free
        self.node_count = 0

    def slots(self, gpus: int) -> int:
        """How many replicas of ``gpus`` GPUs fit, each on a single node."""
        hist = self.hist
        if 2 * gpus >= len(hist):  # at most one such replica per node
            return sum(hist[gpus:])
        return sum(hist[k] * (k // gpus) for k in range(gpus, len(hist)) if hist[k])

    def nodes(self) -> Iterator[Node]:
        if isinstance(self, Node):
            yield self
            return
        for child in self.children:
            yield from child.nodes()

    def __repr__(self) -> str:
        return f"<{self.level.name} {self.key} free={self.free}/{self.capacity}>"


class Node(Domain):
    """A schedulable node: a leaf of the tree that holds actual GPU indices."""

    __slots__ = ("info", "free_gpus", "gpus", "chain", "path")

    def __init__(self, info: NodeInfo, parent: Domain, width: int, free_gpus: Iterable[int]) -> None:
        super().__init__(info.node_id, Level.NODE, parent, width)
        self.info = info
        self.gpus = info.gpus
        self.free_gpus = sorted(set(free_gpus))  # indices, ascending
        self.chain: list[Domain] = []  # this node, then every ancestor up to the root
        self.path: tuple[str, ...] = ()  # (zone, block, rack, nvlink, node) for rank order

    @classmethod
    def leaf(cls, info: NodeInfo, above: list[Domain], width: int, free_gpus: list[int]) -> Node:
        """A node under ``above`` (its parent first, up to the root) with ``free_gpus`` (sorted, unique) free.

        What ``__init__`` and the aggregates of a lone node come to, without the general path: a cycle
        builds thousands of these.
        """
        node = cls.__new__(cls)
        count = len(free_gpus)
        gpus = info.gpus
        node.key = info.node_id
        node.level = Level.NODE
        node.parent = above[0]
        node.children = []
        node.free = count
        hist = [0] * (width + 1)
        hist[count] = 1
        node.hist = hist
        node.capacity = gpus
        node.whole = int(count == gpus)
        node.node_count = 1
        node.info = info
        node.gpus = gpus
        node.free_gpus = free_gpus
        node.chain = [node, *above]
        node.path = (info.zone, info.block, info.rack, info.nvlink_domain or info.node_id, info.node_id)
        return node


class Tree:
    """Every schedulable node of one GPU type, with domain indexes per level."""

    def __init__(self, gpu_type: str, width: int) -> None:
        self.gpu_type = gpu_type
        self.width = width  # the most GPUs on one node of this type
        self.root = Domain("*", Level.CLUSTER, None, width)
        self.levels: dict[Level, dict[str, Domain]] = {lvl: {} for lvl in Level}
        self.levels[Level.CLUSTER]["*"] = self.root
        self.largest: dict[Level, int] = {}  # GPUs of the largest domain per level, to skip levels

    def domain(self, level: Level, key: str, parent: Domain) -> Domain:
        index = self.levels[level]
        found = index.get(key)
        if found is None:
            found = index[key] = Domain(key, level, parent, self.width)
            parent.children.append(found)
        return found

    def domains(self, level: Level) -> list[Domain]:
        """Domains at ``level``; NVLink domains here are only the multi-node ones."""
        return list(self.levels[level].values())


def subdomains(domain: Domain, level: Level) -> list[Domain]:
    """The domains at ``level`` inside ``domain``; a node without NVSwitch is its own NVLink domain."""
    if domain.level <= level:
        return [domain]
    out: list[Domain] = []
    for child in domain.children:
        out.extend(subdomains(child, level))
    return out


def domain_key(info: NodeInfo, level: Level) -> str:
    """The key of the domain at ``level`` that holds the node."""
    if level is Level.CLUSTER:
        return "*"
    if level is Level.ZONE:
        return info.zone
    if level is Level.BLOCK:
        return f"{info.zone}/{info.block}"
    if level is Level.RACK:
        return f"{info.zone}/{info.block}/{info.rack}"
    if level is Level.NVLINK:
        if info.nvlink_domain is None:
            return info.node_id
        return f"{info.zone}/{info.block}/{info.rack}/{info.nvlink_domain}"
    return info.node_id


class Topology:
    """The per-GPU-type trees of one placement cycle."""

    def __init__(self, trees: dict[str, Tree], capacity_by_type: dict[str, int]) -> None:
        self.trees = trees
        # Every domain at the NODE level is a Node (``build`` puts only Nodes there).
        self.nodes: dict[str, Node] = {
            n.key: cast(Node, n) for t in trees.values() for n in t.levels[Level.NODE].values()
        }
        self.capacity_by_type = capacity_by_type  # GPUs of every node in the snapshot, schedulable or not
        self.journal: list[tuple[Node, list[int]]] | None = None  # while recording: each change's node, GPUs before

    @classmethod
    def build(cls, views: Iterable[tuple[NodeInfo, Iterable[int], bool]]) -> Topology:
        """Build from ``(info, free GPU indices, schedulable)`` triples."""
        views = sorted(views, key=lambda v: v[0].node_id)
        capacity: dict[str, int] = {}
        widths: dict[str, int] = {}
        for info, _, schedulable in views:
            capacity[info.gpu_type] = capacity.get(info.gpu_type, 0) + info.gpus
            if schedulable and info.gpus > 0:
                widths[info.gpu_type] = max(widths.get(info.gpu_type, 0), info.gpus)
        trees = {t: Tree(t, w) for t, w in widths.items()}
        seen: set[str] = set()
        # (type, zone, block, rack, nvlink) -> parent .. root
        ancestors: dict[tuple[str, str, str, str, str | None], list[Domain]] = {}
        for info, free, schedulable in views:
            if not schedulable or info.gpus <= 0 or info.node_id in seen:
                continue
            seen.add(info.node_id)
            tree = trees[info.gpu_type]
            where = (info.gpu_type, info.zone, info.block, info.rack, info.nvlink_domain)
            above = ancestors.get(where)
            if above is None:
                parent = tree.root
                for level in (Level.ZONE, Level.BLOCK, Level.RACK):
                    parent = tree.domain(level, domain_key(info, level), parent)
                if info.nvlink_domain is not None:
                    parent = tree.domain(Level.NVLINK, domain_key(info, Level.NVLINK), parent)
                above = ancestors[where] = [parent]
                while above[-1].parent is not None:
                    above.append(above[-1].parent)
            gpus = info.gpus
            node = Node.leaf(info, above, tree.width, sorted({g for g in free if 0 <= g < gpus}))
            above[0].children.append(node)
            tree.levels[Level.NODE][node.key] = node

        def by_key(d: Domain) -> str:
            return d.key

        for tree in trees.values():
            _roll_up(tree.root)
            for level, index in tree.levels.items():
                tree.largest[level] = max((d.capacity for d in index.values()), default=0)
                if level is not Level.NODE:  # nodes have no children
                    for d in index.values():
                        d.children.sort(key=by_key)
        return cls(trees, capacity)

    def take(self, node: Node, gpus: Iterable[int]) -> list[int]:
        """Mark ``gpus`` on ``node`` as used; returns the ones that were free."""
        free = node.free_gpus
        wanted = set(gpus)
        taken = [g for g in free if g in wanted]
        if taken:
            if self.journal is not None:
                self.journal.append((node, free))
            left = node.free_gpus = [g for g in free if g not in wanted] if len(taken) < len(free) else []
            self._update(node, len(free), len(left))
        return taken

    def give(self, node: Node, gpus: Iterable[int]) -> list[int]:
        """Mark ``gpus`` on ``node`` as free; returns the ones that were used."""
        free = node.free_gpus
        n = node.gpus
        given = sorted({g for g in gpus if 0 <= g < n}.difference(free))
        if given:
            if self.journal is not None:
                self.journal.append((node, free))
            now = node.free_gpus = sorted(free + given) if free else list(given)
            self._update(node, len(free), len(now))
        return given

    def reset(self, node: Node, free_gpus: list[int]) -> None:
        """Put ``node``'s free GPUs back to ``free_gpus``, what they were before the changes being undone."""
        free = node.free_gpus
        if self.journal is not None:
            self.journal.append((node, free))
        node.free_gpus = free_gpus
        self._update(node, len(free), len(free_gpus))

    def record(self) -> None:
        """Keep every take and give from now on, so that :meth:`restore` can undo them."""
        if self.journal is not None:
            raise RuntimeError("the topology is already recording its changes")
        self.journal = []

    def restore(self) -> None:
        """Undo every take and give since :meth:`record`, latest first, and stop recording."""
        journal, self.journal = self.journal or [], None
        for node, before in reversed(journal):
            now = len(node.free_gpus)
            node.free_gpus = before
            self._update(node, now, len(before))

    @staticmethod
    def _update(node: Node, old: int, new: int) -> None:
        delta = new - old
        full = node.gpus
        chain = node.chain
        for d in chain:
            d.free += delta
            hist = d.hist
            hist[old] -= 1
            hist[new] += 1
        whole = (new == full) - (old == full)
        if whole:
            for d in chain:
                d.whole += whole


def _roll_up(domain: Domain) -> None:
    """Fill a domain's aggregates from its children's (nodes already hold their own)."""
    if isinstance(domain, Node):
        return
    hist = domain.hist
    for child in domain.children:
        _roll_up(child)
        domain.capacity += child.capacity
        domain.node_count += child.node_count
        domain.free += child.free
        domain.whole += child.whole
        if isinstance(child, Node):
            hist[child.free] += 1
        else:
            for k, n in enumerate(child.hist):
                if n:
                    hist[k] += n
