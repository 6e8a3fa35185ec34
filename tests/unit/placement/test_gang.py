"""Gang and topology-aware placement: where whole gangs land, and why others wait."""

from __future__ import annotations

import pytest
from placement_builders import busy, infos, job, nodes, placed_nodes, racks, request, role, snapshot

from trainyard.core.placement import place
from trainyard.core.placement.cycle import build_topology
from trainyard.core.placement.gang import fit_gang
from trainyard.core.placement.probe import Probe
from trainyard.core.placement.topology import Level
from trainyard.core.reasons import PendingReason

NOW = 1_000.0


@pytest.mark.parametrize(
    "groups, spec, expected_racks",
    [
        pytest.param(
            [nodes(4, rack="r1"), nodes(8, rack="r2", free=5)],
            job(replicas=4),
            {"r1"},
            id="gang of 4x8 GPUs lands in one rack when one rack has 4 free nodes, "
            "even though another rack has more free GPUs in total",
        ),
        pytest.param(
            [nodes(3, rack="r1"), nodes(2, rack="r2")],
            job(replicas=4),
            {"r1", "r2"},
            id="gang of 4x8 spills to a second rack when the first has 3 free nodes",
        ),
        pytest.param(
            [nodes(16, rack="r1"), nodes(4, rack="r2"), busy(nodes(12, rack="r2", name="r2-busy"))],
            job(replicas=4),
            {"r2"},
            id="gang of 4x8 takes the rack it fills exactly and leaves the empty rack whole",
        ),
        pytest.param(
            [nodes(16, rack="r1", block="b1"), nodes(4, rack="r2", block="b1"), nodes(16, rack="r3", block="b2")],
            job(replicas=20),
            {"r1", "r2"},
            id="gang of 20x8 stays in one block across two racks rather than two blocks",
        ),
        pytest.param(
            [nodes(2, rack="r1"), nodes(1, rack="r2", free=8), busy(nodes(3, rack="r2", name="r2-busy"))],
            job(replicas=1),
            {"r2"},
            id="a single 8-GPU job goes to the busiest rack and leaves the free rack whole",
        ),
    ],
)
def test_gang_lands_in_the_tightest_domain(groups, spec, expected_racks):
    snap = snapshot(*groups)
    result = place(snap, [request(spec)], NOW)
    assert racks(result, snap) == expected_racks
    assert len(placed_nodes(result)) == spec.replica_count


@pytest.mark.parametrize(
    "groups, spec, reason",
    [
        pytest.param(
            [
                nodes(3, rack="r1"),
                busy(nodes(1, rack="r1", name="r1-busy")),
                nodes(3, rack="r2"),
                busy(nodes(1, rack="r2", name="r2-busy")),
            ],
            job(replicas=4, level="rack"),
            PendingReason.TOPOLOGY,
            id="a gang that must stay in one rack waits when no rack has 4 free nodes",
        ),
        pytest.param(
            [nodes(4, rack="r1"), nodes(4, rack="r2")],
            job(replicas=6, level="rack"),
            PendingReason.GANG_LARGER_THAN_DOMAIN,
            id="a gang larger than any rack waits with a reason that says so",
        ),
        pytest.param(
            [nodes(4, rack="r1")],
            job(replicas=1, gpu_type="B200"),
            PendingReason.NO_CAPACITY_OF_TYPE,
            id="no nodes of the GPU type",
        ),
        pytest.param(
            [nodes(2, rack="r1")],
            job(replicas=3),
            PendingReason.GANG_LARGER_THAN_CLUSTER,
            id="gang larger than the whole cluster",
        ),
        pytest.param(
            [nodes(4, rack="r1", free=4)],
            job(replicas=2),
            PendingReason.FRAGMENTED,
            id="16 GPUs free in halves cannot hold one 8-GPU replica",
        ),
        pytest.param(
            [nodes(2, rack="r1"), busy(nodes(2, rack="r2"))],
            job(replicas=3),
            PendingReason.INSUFFICIENT_GPUS,
            id="not enough free GPUs while others run",
        ),
        pytest.param(
            [nodes(4, rack="r1", schedulable=False)],
            job(replicas=1),
            PendingReason.NO_CAPACITY_OF_TYPE,
            id="cordoned nodes take no work",
        ),
    ],
)
def test_gang_that_cannot_start_gets_a_reason(groups, spec, reason):
    snap = snapshot(*groups)
    result = place(snap, [request(spec)], NOW)
    assert result.placements == []
    assert [u.reason for u in result.unplaced] == [reason]


@pytest.mark.parametrize(
    "groups, spec, expected_node",
    [
        pytest.param(
            [nodes(1, rack="r1", name="full-free-"), nodes(1, rack="r1", free=3, name="partly-")],
            job(replicas=1, gpus=1),
            "partly-00",
            id="a 1-GPU job goes to the partly used node, not a free one",
        ),
        pytest.param(
            [nodes(1, rack="r1", free=2, name="two-"), nodes(1, rack="r1", free=4, name="four-")],
            job(replicas=2, gpus=2),
            "four-00",
            id="two 2-GPU replicas share the node that holds both",
        ),
    ],
)
def test_small_jobs_fill_partly_used_nodes(groups, spec, expected_node):
    snap = snapshot(*groups)
    result = place(snap, [request(spec)], NOW)
    assert set(placed_nodes(result)) == {expected_node}


def test_trainers_share_one_nvlink_domain_while_rollout_goes_anywhere_in_the_block():
    snap = snapshot(
        nodes(2, gpus=4, rack="r1", nvlink="nvA", gpu_type="GB200"),
        nodes(4, gpus=4, rack="r1", nvlink="nvB", gpu_type="GB200"),
        nodes(2, gpus=4, rack="r2", gpu_type="GB200"),
        nodes(8, gpus=4, rack="r9", block="b2", gpu_type="GB200"),
    )
    spec = job(
        roles=[
            role("trainer", replicas=4, gpus=4, level="nvlink", gpu_type="GB200"),
            role("rollout", replicas=4, gpus=4, gpu_type="GB200"),
        ],
        level="block",
    )
    result = place(snap, [request(spec)], NOW)
    by_id = infos(snap)
    (p,) = result.placements
    trainers = [by_id[r.node_id] for r in p.replicas if r.role == "trainer"]
    everyone = [by_id[r.node_id] for r in p.replicas]
    assert {i.nvlink for i in trainers} == {"nvB"}
    assert {i.block for i in everyone} == {"b1"}
    assert sorted(r.rank for r in p.replicas) == list(range(8))


def test_mixed_gpu_types_are_placed_whole_in_one_block():
    snap = snapshot(
        nodes(2, rack="r1", block="b1"),
        nodes(2, rack="r2", block="b2"),
        nodes(2, gpus=4, rack="r3", block="b2", gpu_type="L40S"),
    )
    spec = job(roles=[role("trainer", replicas=2), role("rollout", replicas=2, gpus=4, gpu_type="L40S")], level="block")
    result = place(snap, [request(spec)], NOW)
    assert {infos(snap)[n].block for n in placed_nodes(result)} == {"b2"}


def test_a_gang_that_does_not_fit_takes_nothing():
    snap = snapshot(nodes(3, rack="r1"))
    result = place(snap, [request(job(replicas=4), "big", 0), request(job(replicas=3), "small", 1)], NOW)
    assert [p.job_id for p in result.placements] == ["small"]
    assert [u.job_id for u in result.unplaced] == ["big"]


def test_ranks_keep_racks_together():
    snap = snapshot(nodes(3, rack="r1"), nodes(3, rack="r2"))
    result = place(snap, [request(job(replicas=6))], NOW)
    (p,) = result.placements
    by_id = infos(snap)
    rack_by_rank = [by_id[r.node_id].rack for r in sorted(p.replicas, key=lambda r: r.rank)]
    assert rack_by_rank == sorted(rack_by_rank)
    assert [r.replica for r in sorted(p.replicas, key=lambda r: r.rank)] == list(range(6))


def test_gangs_are_placed_in_order_and_never_share_a_gpu():
    snap = snapshot(nodes(4, rack="r1"))
    reqs = [request(job(replicas=1, gpus=3), f"j{i}", i) for i in range(10)]
    result = place(snap, reqs, NOW)
    used = [(r.node_id, g) for p in result.placements for r in p.replicas for g in r.gpus]
    assert len(used) == len(set(used)) == 24
    assert [u.job_id for u in result.unplaced] == ["j8", "j9"]


def test_preferred_level_falls_back_to_wider_domain():
    snap = snapshot(nodes(2, rack="r1"), nodes(2, rack="r2"))
    result = place(snap, [request(job(replicas=3, level="rack", required=False))], NOW)
    assert racks(result, snap) == {"r1", "r2"}


@pytest.mark.parametrize(
    "required, placed",
    [
        pytest.param(False, True, id="trainers that only prefer one NVLink domain spread when none has room"),
        pytest.param(True, False, id="trainers that require one NVLink domain wait when none has room"),
    ],
)
def test_role_constraint_required_or_preferred(required, placed):
    snap = snapshot(
        nodes(2, gpus=4, rack="r1", nvlink="nvA", gpu_type="GB200"),
        nodes(2, gpus=4, rack="r1", nvlink="nvB", gpu_type="GB200"),
    )
    spec = job(roles=[role("trainer", replicas=3, gpus=4, level="nvlink", required=required, gpu_type="GB200")])
    result = place(snap, [request(spec)], NOW)
    assert bool(result.placements) is placed
    if not placed:
        assert result.unplaced[0].reason is PendingReason.TOPOLOGY


def test_snapshot_without_new_fields_still_places():
    from trainyard.core.placement import ClusterSnapshot

    snap = ClusterSnapshot(nodes=nodes(2, rack="r1"))
    result = place(snap, [request(job(replicas=2))], NOW)
    assert len(result.placements[0].replicas) == 2
    assert result.reservations == [] and not result.placements[0].backfilled


def test_within_a_block_the_aggregate_check_keeps_the_gangs_own_rack_constraint():
    # Block b1 has two 4-GPU slots, one in each rack: enough for the block, not for any one rack.
    topo = build_topology(snapshot(nodes(1, free=4, rack="r1"), nodes(1, free=4, rack="r2")))
    (block,) = topo.trees["H100"].levels[Level.BLOCK]
    for level, expected in (("rack", False), ("block", True)):
        spec = job(replicas=2, gpus=4, level=level)
        assert Probe(topo, spec, (Level.BLOCK, block)).now() is expected
        assert (fit_gang(topo, spec, within=(Level.BLOCK, block)) is not None) is expected
