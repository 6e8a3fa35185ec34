"""Kubernetes translation of node health: Node dict in, patch out."""

from __future__ import annotations

import pytest

from trainyard.kube.taints import CORDONED_ANNOTATION, REASON_ANNOTATION, TAINT_KEY, patch_for_state

NOT_READY = {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}
GPU_VENDOR = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def node(unschedulable: bool = False, taints: list | None = None, annotations: dict | None = None) -> dict:
    return {
        "metadata": {"name": "n1", "resourceVersion": "42", "annotations": annotations or {}},
        "spec": {"unschedulable": unschedulable, "taints": taints or []},
    }


OURS_SOFT = {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}
OURS_HARD = {"key": TAINT_KEY, "value": "true", "effect": "NoExecute"}


@pytest.mark.parametrize(
    "before, state, fatal, taints, unschedulable, cordoned_by_us",
    [
        pytest.param(
            node(),
            "cordoned",
            False,
            [OURS_SOFT],
            True,
            "true",
            id="cordon taints NoSchedule and marks the node unschedulable",
        ),
        pytest.param(node(), "draining", True, [OURS_HARD], True, "true", id="a fatal fault taints NoExecute"),
        pytest.param(
            node(taints=[NOT_READY, GPU_VENDOR]),
            "cordoned",
            False,
            [NOT_READY, GPU_VENDOR, OURS_SOFT],
            True,
            "true",
            id="other owners' taints and node.kubernetes.io taints are kept as they are",
        ),
        pytest.param(
            node(unschedulable=True),
            "cordoned",
            False,
            [OURS_SOFT],
            True,
            None,
            id="a node a person cordoned is tainted but not claimed as ours",
        ),
        pytest.param(
            node(taints=[OURS_SOFT]),
            "draining",
            True,
            [OURS_HARD],
            True,
            "true",
            id="a suspect node that turns fatal moves to NoExecute",
        ),
    ],
)
def test_cordon(before, state, fatal, taints, unschedulable, cordoned_by_us) -> None:
    patch = patch_for_state(before, state, fatal=fatal, reason="XID 79")
    assert patch is not None
    assert patch["spec"]["taints"] == taints
    assert patch["spec"]["unschedulable"] is unschedulable
    assert patch["metadata"]["annotations"].get(CORDONED_ANNOTATION) == cordoned_by_us
    assert patch["metadata"]["annotations"][REASON_ANNOTATION] == "XID 79"
    assert patch["metadata"]["resourceVersion"] == "42"


@pytest.mark.parametrize(
    "before, expected",
    [
        pytest.param(
            node(True, [NOT_READY, OURS_HARD], {CORDONED_ANNOTATION: "true", REASON_ANNOTATION: "x"}),
            {"taints": [NOT_READY], "unschedulable": False},
            id="uncordon removes our taint and our cordon only",
        ),
        pytest.param(
            node(True, [OURS_SOFT], {REASON_ANNOTATION: "x"}),
            {"taints": []},
            id="a person's cordon stays when Trainyard returns the node",
        ),
        pytest.param(node(False, [GPU_VENDOR]), None, id="nothing to undo: no patch"),
    ],
)
def test_uncordon(before, expected) -> None:
    patch = patch_for_state(before, "healthy")
    if expected is None:
        assert patch is None
        return
    assert patch["spec"] == expected
    assert patch["metadata"]["annotations"] == {CORDONED_ANNOTATION: None, REASON_ANNOTATION: None}


def test_an_already_cordoned_node_needs_no_patch() -> None:
    tainted = node(True, [OURS_SOFT], {CORDONED_ANNOTATION: "true", REASON_ANNOTATION: "XID 79"})
    assert patch_for_state(tainted, "cordoned", reason="XID 79") is None
