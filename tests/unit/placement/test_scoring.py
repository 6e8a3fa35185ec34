"""Fragmentation figures, and placement choices that keep large domains whole."""

from __future__ import annotations

import pytest
from placement_builders import busy, holding, job, nodes, racks, request, snapshot

from trainyard.core.placement import fragmentation, place, propose_moves

NOW = 1_000.0


@pytest.mark.parametrize(
    "groups, expected",
    [
        pytest.param(
            [nodes(8, rack="r1")],
            {"free_gpus": 64.0, "unusable_by_8": 0.0, "unusable_by_64": 0.0, "whole_free_racks": 1.0},
            id="an empty 64-GPU rack is usable by every probe",
        ),
        pytest.param(
            [nodes(8, rack="r1", free=4)],
            {"free_gpus": 32.0, "unusable_by_8": 1.0, "unusable_by_64": 1.0, "whole_free_racks": 0.0},
            id="half-free nodes are useless to 8-GPU jobs",
        ),
        pytest.param(
            [nodes(7, rack="r1"), nodes(1, rack="r1", free=6, name="part-"), nodes(8, rack="r2")],
            {"free_gpus": 126.0, "unusable_by_8": 6 / 126, "unusable_by_64": 62 / 126, "whole_free_racks": 1.0},
            id="a rack with one broken node no longer holds a 64-GPU job",
        ),
        pytest.param(
            [nodes(8, rack="r1", schedulable=False)],
            {"free_gpus": 0.0, "unusable_by_8": 0.0, "unusable_by_64": 0.0},
            id="cordoned nodes count for nothing",
        ),
    ],
)
def test_fragmentation_figure(groups, expected):
    figure = fragmentation(snapshot(*groups))
    for key, value in expected.items():
        assert figure[key] == pytest.approx(value), key


def test_stream_of_small_jobs_keeps_a_free_rack_whole():
    snap = snapshot(nodes(8, rack="r1"), nodes(4, rack="r2", free=3), busy(nodes(4, rack="r2", name="r2-busy")))
    reqs = [request(job(replicas=1, gpus=1), f"s{i}", i) for i in range(12)]
    reqs.append(request(job(replicas=8), "big", 99))
    result = place(snap, reqs, NOW)
    assert len(result.placements) == 13
    assert racks(result, snap, "big") == {"r1"}


def test_defragmentation_moves_preemptible_runs_out_of_a_nearly_free_rack():
    r1 = nodes(3, rack="r1") + busy(nodes(1, rack="r1", name="r1-held"))
    r2 = nodes(2, rack="r2", free=4, name="r2-half")
    runs = [holding("squatter", {"r1-held00": [0, 1, 2, 3]}, NOW - 10, 3600, preemptible=True)]
    r1 = r1[:3] + [r1[3].__class__(r1[3].info, (4, 5, 6, 7))]
    snap = snapshot(r1, r2, running=runs)
    moves = propose_moves(snap, NOW)
    assert [m.run_id for m in moves] == ["squatter-run1"]
    assert moves[0].rack == "z1/b1/r1"
    assert {r.node_id for r in moves[0].to} <= {"r2-half00", "r2-half01"}


def test_defragmentation_leaves_racks_with_protected_runs_alone():
    r1 = nodes(3, rack="r1") + busy(nodes(1, rack="r1", name="r1-held"))
    runs = [holding("protected", {"r1-held00": list(range(8))}, NOW - 10, 3600, preemptible=False)]
    snap = snapshot(r1, nodes(2, rack="r2"), running=runs)
    assert propose_moves(snap, NOW) == []
