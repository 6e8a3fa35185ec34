"""The topology tree: structure, aggregates, and aggregates kept exact through take and give, and through the
restore that undoes every take and give since a record."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from placement_builders import nodes, snapshot

from trainyard.core.placement.cycle import build_topology
from trainyard.core.placement.topology import Level, Topology, subdomains
from trainyard.domain.node import NodeInfo


def test_tree_levels_and_aggregates():
    snap = snapshot(
        nodes(2, rack="r1", nvlink="nvA", free=8),
        nodes(2, rack="r1", free=3),
        nodes(4, rack="r2", block="b2"),
        nodes(2, rack="r9", gpu_type="L40S", gpus=4),
        nodes(3, rack="r3", schedulable=False),
    )
    topo = build_topology(snap)
    h100 = topo.trees["H100"]
    rack = h100.levels[Level.RACK]["z1/b1/r1"]
    assert (rack.free, rack.capacity, rack.whole, rack.node_count) == (22, 32, 2, 4)
    assert rack.hist[8] == 2 and rack.hist[3] == 2
    assert rack.slots(8) == 2 and rack.slots(1) == 22 and rack.slots(2) == 10
    assert list(h100.levels[Level.NVLINK]) == ["z1/b1/r1/nvA"]
    assert {d.key for d in subdomains(rack, Level.NVLINK)} == {"z1/b1/r1/nvA", "z1-b1-r1-n00", "z1-b1-r1-n01"}
    assert h100.root.free == 22 + 32
    assert topo.trees["L40S"].root.capacity == 8
    assert "z1-b1-r3-n00" not in topo.nodes  # cordoned nodes are not in the tree
    assert topo.capacity_by_type["H100"] == 64 + 24  # but count toward the cluster's size
    assert h100.largest[Level.RACK] == 32 and h100.largest[Level.BLOCK] == 32


def state(topo: Topology) -> tuple:
    """Every node's free GPUs and every domain's aggregates."""
    return tuple(
        (d.key, d.free, d.whole, tuple(d.hist), tuple(getattr(d, "free_gpus", ())))
        for tree in topo.trees.values()
        for index in tree.levels.values()
        for d in index.values()
    )


class TakeAndGive(RuleBasedStateMachine):
    """Any sequence of takes and gives keeps every aggregate equal to a fresh count; a restore puts back the
    tree as it was when recording began."""

    def __init__(self) -> None:
        super().__init__()
        infos = [
            NodeInfo(
                f"n{i}",
                "c",
                "H100",
                8 if i % 3 else 4,
                rack=f"r{i % 2}",
                block=f"b{i % 3 // 2}",
                nvlink_domain="nv" if i in (1, 3) else None,
            )
            for i in range(6)
        ]
        self.topo = Topology.build((i, range(i.gpus), True) for i in infos)
        self.ids = sorted(self.topo.nodes)
        self.recorded: tuple | None = None  # the state when recording began

    @rule(node=st.integers(0, 5), gpus=st.lists(st.integers(0, 8), max_size=8))
    def take(self, node, gpus):
        n = self.topo.nodes[self.ids[node]]
        before = set(n.free_gpus)
        taken = self.topo.take(n, gpus)
        assert set(taken) == before & set(gpus)

    @rule(node=st.integers(0, 5), gpus=st.lists(st.integers(0, 8), max_size=8))
    def give(self, node, gpus):
        n = self.topo.nodes[self.ids[node]]
        before = set(n.free_gpus)
        given = self.topo.give(n, gpus)
        assert set(given) == {g for g in gpus if g < n.gpus} - before

    @precondition(lambda self: self.recorded is None)
    @rule()
    def record(self):
        self.recorded = state(self.topo)
        self.topo.record()

    @precondition(lambda self: self.recorded is not None)
    @rule()
    def restore(self):
        self.topo.restore()
        assert state(self.topo) == self.recorded
        self.recorded = None

    @invariant()
    def aggregates_match_a_fresh_count(self):
        for tree in self.topo.trees.values():
            for index in tree.levels.values():
                for d in index.values():
                    inside = list(d.nodes())
                    assert d.free == sum(len(n.free_gpus) for n in inside)
                    assert d.whole == sum(len(n.free_gpus) == n.gpus for n in inside)
                    assert d.capacity == sum(n.gpus for n in inside)
                    for k, count in enumerate(d.hist):
                        assert count == sum(len(n.free_gpus) == k for n in inside)


TestTakeAndGive = TakeAndGive.TestCase
TestTakeAndGive.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
