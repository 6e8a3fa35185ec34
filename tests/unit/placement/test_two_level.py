"""The two-level rule: a gang goes on the fewest spines (blocks) and, within them, on the
fewest leaves (racks); best fit only breaks ties between placements equal on both counts.

The property test checks the rule against a brute-force oracle that tries every set of
leaves of small fragmented clusters.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from placement_builders import busy, infos, job, nodes, placed_nodes, request, snapshot

from trainyard.core.placement import NodeView, place
from trainyard.core.placement.cycle import build_topology
from trainyard.core.placement.leaves import plan, span
from trainyard.core.placement.topology import Level
from trainyard.domain.node import NodeInfo

NOW = 1_000.0


def spines_and_leaves(result, snap) -> tuple[set[str], set[str]]:
    by_id = infos(snap)
    placed = [by_id[n] for n in placed_nodes(result)]
    return {i.block for i in placed}, {f"{i.block}/{i.rack}" for i in placed}


@pytest.mark.parametrize(
    "groups, spec, expected_leaves",
    [
        pytest.param(
            [
                *(nodes(4, rack=f"r{i}", block="b1") for i in range(1, 5)),
                *(busy(nodes(4, rack=f"r{i}", block="b1", name=f"b1-r{i}-busy-")) for i in range(1, 5)),
                nodes(8, rack="r5", block="b2"),
                nodes(8, rack="r6", block="b2"),
                nodes(2, rack="r7", block="b2"),
            ],
            job(replicas=16),
            {"b2/r5", "b2/r6"},
            id="gang of 16x8 takes the spine where two whole leaves hold it, not the fuller spine "
            "that would spread it over four half-free leaves",
        ),
        pytest.param(
            [
                *(nodes(3, rack=f"r{i}", block="b1") for i in range(1, 6)),
                nodes(8, rack="r6", block="b2"),
                nodes(2, rack="r7", block="b2"),
                nodes(8, rack="r8", block="b3"),
                nodes(4, rack="r9", block="b3"),
            ],
            job(replicas=20),
            {"b2/r6", "b3/r8", "b3/r9"},
            id="gang of 20x8 that needs two spines takes the two whose leaves hold it in three leaves, "
            "not the spine with the most free nodes spread over five leaves",
        ),
        pytest.param(
            [
                *(nodes(2, rack=f"r{i}", block="b1", free=4) for i in range(1, 4)),
                nodes(2, rack="r4", block="b2"),
                nodes(2, rack="r5", block="b2"),
            ],
            job(replicas=6, gpus=4),
            {"b2/r4", "b2/r5"},
            id="six half-node replicas take two leaves of free nodes rather than three leaves of half-free nodes",
        ),
        pytest.param(
            [
                nodes(8, rack="r1", block="b1"),
                nodes(8, rack="r2", block="b1"),
                nodes(8, rack="r3", block="b2"),
                nodes(8, rack="r4", block="b2"),
                nodes(4, rack="r5", block="b2"),
            ],
            job(replicas=16),
            {"b1/r1", "b1/r2"},
            id="when two spines need as few leaves, best fit takes the spine left with fewer free GPUs",
        ),
        pytest.param(
            [nodes(8, rack="r1", block="b1"), nodes(6, rack="r2", block="b1"), nodes(3, rack="r3", block="b1")],
            job(replicas=11),
            {"b1/r1", "b1/r3"},
            id="inside a spine the largest leaf goes first and the rest takes the leaf it fills most exactly",
        ),
    ],
)
def test_gang_uses_the_fewest_leaves_on_the_fewest_spines(groups, spec, expected_leaves):
    snap = snapshot(*groups)
    result = place(snap, [request(spec)], NOW)
    assert spines_and_leaves(result, snap)[1] == expected_leaves
    assert len(placed_nodes(result)) == spec.replica_count


@pytest.mark.parametrize(
    "groups, gpus, count, expected",
    [
        pytest.param([nodes(4, rack="r1")], 8, 3, (1, 1), id="one leaf that holds the gang"),
        pytest.param([nodes(4, rack="r1"), nodes(4, rack="r2")], 8, 6, (1, 2), id="two leaves of one spine"),
        pytest.param(
            [nodes(4, rack="r1", block="b1"), nodes(4, rack="r2", block="b2"), nodes(1, rack="r3", block="b2")],
            8,
            9,
            (2, 3),
            id="nine nodes need both spines and all three leaves",
        ),
        pytest.param([nodes(4, rack="r1", free=3)], 4, 1, None, id="no node has four free GPUs"),
    ],
)
def test_span_counts_spines_then_leaves(groups, gpus, count, expected):
    root = build_topology(snapshot(*groups)).trees["H100"].root
    assert span(root, gpus, count) == expected


def test_the_plan_gives_every_chosen_spine_its_share_and_nothing_more():
    snap = snapshot(
        nodes(5, rack="r1", block="b1"),
        nodes(8, rack="r2", block="b2"),
        nodes(8, rack="r3", block="b3"),
        nodes(3, rack="r4", block="b3"),
    )
    root = build_topology(snap).trees["H100"].root
    chosen = plan(root, 8, 13)
    assert chosen is not None
    assert sorted((spine.key, replicas, leaves) for spine, replicas, leaves in chosen) == [
        ("z1/b1", 5, 1),
        ("z1/b2", 8, 1),
    ]


# --- the property: optimal on both levels, against brute force ----------------------------


@st.composite
def fragmented_clusters(draw) -> list[NodeView]:
    """One zone, 1-3 spines of 1-3 leaves of 1-4 eight-GPU nodes; each node free, busy or partly busy."""
    views: list[NodeView] = []
    for s in range(draw(st.integers(1, 3))):
        for leaf in range(draw(st.integers(1, 3))):
            nvlink = draw(st.sampled_from([None, None, "nv"]))
            for n in range(draw(st.integers(1, 4))):
                free = draw(st.sampled_from([8, 8, 8, 0, 0, 3, 7]))
                info = NodeInfo(
                    f"s{s}-l{leaf}-n{n}",
                    "c1",
                    "H100",
                    8,
                    zone="z1",
                    block=f"s{s}",
                    rack=f"l{leaf}",
                    nvlink_domain=nvlink,
                )
                schedulable = draw(st.sampled_from([True, True, True, False]))
                views.append(NodeView(info, tuple(range(8 - free, 8)), schedulable))
    return views


def brute_force_optimum(views: list[NodeView], replicas: int, one_spine: bool) -> tuple[int, int] | None:
    """Every set of leaves whose whole free nodes hold the gang; the fewest spines, then leaves."""
    whole: dict[tuple[str, str], int] = {}
    for v in views:
        if v.schedulable and len(v.free_gpus) == v.info.gpus:
            key = (v.info.block, v.info.rack)
            whole[key] = whole.get(key, 0) + 1
    leaves = sorted(whole)
    best = None
    for size in range(1, len(leaves) + 1):
        for chosen in itertools.combinations(leaves, size):
            if sum(whole[c] for c in chosen) < replicas:
                continue
            score = (len({spine for spine, _ in chosen}), size)
            if one_spine and score[0] > 1:
                continue
            best = score if best is None else min(best, score)
    return best


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(views=fragmented_clusters(), replicas=st.integers(1, 14), one_spine=st.booleans())
def test_whole_node_gangs_use_the_fewest_spines_then_the_fewest_leaves(views, replicas, one_spine):
    snap = snapshot(views)
    spec = job(replicas=replicas, level="block" if one_spine else None)
    result = place(snap, [request(spec)], NOW)
    best = brute_force_optimum(views, replicas, one_spine)
    if best is None:
        assert result.placements == []
        return
    spines, leaves = spines_and_leaves(result, snap)
    assert (len(spines), len(leaves)) == best
    assert len(set(placed_nodes(result))) == replicas  # one whole node per replica


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(views=fragmented_clusters(), replicas=st.integers(1, 14), gpus=st.sampled_from([8, 4, 1]))
def test_the_plan_shares_out_the_whole_gang_within_each_spines_room_and_changes_nothing(views, replicas, gpus):
    topo = build_topology(snapshot(views))
    tree = topo.trees.get("H100")
    if tree is None:
        return
    before = {k: (d.free, list(d.hist), d.whole) for lvl in Level for k, d in tree.levels[lvl].items()}
    chosen = plan(tree.root, gpus, replicas)
    assert before == {k: (d.free, list(d.hist), d.whole) for lvl in Level for k, d in tree.levels[lvl].items()}
    if chosen is None:
        assert tree.root.slots(gpus) < replicas
        return
    assert sum(share for _, share, _ in chosen) == replicas
    for spine, share, leaves in chosen:
        assert 0 < share <= spine.slots(gpus)
        assert span(spine, gpus, share) == (1, leaves)
    assert span(tree.root, gpus, replicas) == (len(chosen), sum(leaves for _, _, leaves in chosen))
