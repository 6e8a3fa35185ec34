"""Whether a gang fits, read from the tree's aggregates alone, without packing it.

Exact for gangs of one GPU type and one replica size without per-role
constraints: best-fit filling then always succeeds where the slots allow, so
the aggregates' answer is ``fit_gang``'s.  For any other gang only packing
tells.  A :class:`Probe` is that check for one gang, built once: asked of the
whole tree or of one domain (``within``, as ``fit_gang`` takes it), and again
and again while GPUs only come back (a reservation's search), from the domains
above the nodes that changed.
"""

from __future__ import annotations

from collections.abc import Iterable

from trainyard.core.placement.gang import _fitting, demands_of, fits, need_of, widest_level
from trainyard.core.placement.topology import Level, Node, Topology
from trainyard.domain.job import JobSpec


class Probe:
    """The aggregate check of one gang; ``exact`` is False when only packing tells."""

    __slots__ = ("exact", "need", "tree", "spec_widest", "root", "widest", "never", "one_node")

    def __init__(self, topo: Topology, spec: JobSpec, within: tuple[Level, str] | None = None) -> None:
        demands = demands_of(spec)
        self.exact = len({(d.gpu_type, d.gpus) for d in demands}) == 1 and all(d.level is None for d in demands)
        self.tree = topo.trees.get(demands[0].gpu_type) if self.exact else None
        self.need = need_of(demands)
        self.spec_widest = widest_level(spec)
        self._narrow(within)

    def inside(self, level: Level, key: str) -> Probe:
        """The same gang's check within one domain: ``Probe(topo, spec, (level, key))``, the spec not read again."""
        probe = Probe.__new__(Probe)
        probe.exact, probe.need, probe.tree, probe.spec_widest = self.exact, self.need, self.tree, self.spec_widest
        probe._narrow((level, key))
        return probe

    def _narrow(self, within: tuple[Level, str] | None) -> None:
        tree = self.tree
        self.widest = self.spec_widest
        self.root = tree.root if tree is not None else None
        if tree is not None and within is not None:
            self.root, self.widest = tree.levels[within[0]].get(within[1]), min(self.widest, within[0])
        self.never = (
            tree is None
            or self.root is None
            or (self.need[0] > tree.largest.get(self.widest, 0) and self.widest > Level.NVLINK)
        )
        self.one_node = tree is not None and self.widest is Level.NVLINK and self.need[0] <= tree.width

    def now(self) -> bool | None:
        """Whether ``fit_gang`` would place the gang now; ``None`` when only packing tells."""
        if not self.exact:
            return None
        if self.never or self.root is None:
            return False
        need = self.need[0]
        if self.one_node and fits(self.root, (need, ((need, 1),))):
            return True  # one node is its own NVLink domain
        return next(_fitting(self.root, self.widest, self.need), None) is not None

    def after(self, nodes: Iterable[Node]) -> bool:
        """Whether the gang fits now, given that it did not before ``nodes`` got GPUs back: only a
        domain above one of them can have become large enough."""
        if self.never:
            return False
        need, widest, root = self.need, self.widest, self.root
        for node in nodes:
            chain = node.chain
            if root not in chain:
                continue  # another GPU type's tree, or outside the domain asked about
            if self.one_node and node.free >= need[0]:
                return True  # one node is its own NVLink domain
            for domain in chain:
                if domain.level == widest:
                    if fits(domain, need):
                        return True
                    break
        return False
