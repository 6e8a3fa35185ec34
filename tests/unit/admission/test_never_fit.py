"""A job that could never be placed on the registered fleet is refused at
intake, naming the largest node or the fleet's size."""

from __future__ import annotations

import pytest

from trainyard.core.admission import FleetSummary, never_fits
from trainyard.domain import JobSpec, Role

FLEET = FleetSummary.of([("H100", 8), ("H100", 8), ("H100", 4), ("A100", 4)])


def job(*roles: Role) -> JobSpec:
    return JobSpec(tenant="acme", queue="q", roles=list(roles), image="reg/t:1")


def test_the_summary_keeps_the_largest_node_and_the_total_per_type() -> None:
    assert FLEET.largest_node == {"H100": 8, "A100": 4}
    assert FLEET.total == {"H100": 20, "A100": 4}
    assert FLEET.nodes == {"H100": 3, "A100": 1}


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param(job(Role(name="t", replicas=2, gpus_per_replica=8)), id="two full nodes fit"),
        pytest.param(job(Role(name="t", replicas=20, gpus_per_replica=1)), id="the whole fleet one GPU at a time fits"),
        pytest.param(
            job(Role(name="t", gpus_per_replica=8), Role(name="r", gpus_per_replica=4, gpu_type="A100")),
            id="a gang over two GPU types that each fit",
        ),
        pytest.param(
            job(Role(name="t", gpus_per_replica=64, gpu_type="B200")), id="a type with no nodes yet is not judged"
        ),
    ],
)
def test_jobs_that_could_run_on_an_idle_fleet_pass(spec: JobSpec) -> None:
    assert never_fits(spec, FLEET) == []


@pytest.mark.parametrize(
    "spec, field, words",
    [
        pytest.param(
            job(Role(name="t", gpus_per_replica=16)),
            "roles[0].gpus_per_replica",
            "the largest H100 node has 8",
            id="a replica larger than any node of its type",
        ),
        pytest.param(
            job(Role(name="t", replicas=3, gpus_per_replica=8)),
            "roles",
            "the whole fleet has 20",
            id="a gang larger than the fleet of its type",
        ),
        pytest.param(
            job(Role(name="t", replicas=2, gpus_per_replica=8), Role(name="r", replicas=5, gpus_per_replica=1)),
            "roles",
            "needs 21 H100 GPUs",
            id="two roles of one type counted together",
        ),
        pytest.param(
            job(Role(name="t", gpus_per_replica=8, gpu_type="A100")),
            "roles[0].gpus_per_replica",
            "largest A100 node has 4",
            id="a replica too large for the other type",
        ),
    ],
)
def test_jobs_that_can_never_fit_are_refused_with_the_size_that_limits_them(
    spec: JobSpec, field: str, words: str
) -> None:
    errors = never_fits(spec, FLEET)
    assert any(e.field == field and words in e.message for e in errors), errors


def test_an_empty_fleet_refuses_nothing() -> None:
    assert never_fits(job(Role(name="t", replicas=100, gpus_per_replica=72)), FleetSummary()) == []
