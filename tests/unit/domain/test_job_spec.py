"""Job spec validation: every problem reported, each naming the field to fix."""

from __future__ import annotations

import msgspec
import pytest

from trainyard.domain import JobSpec, Role, TopologyConstraint, TopologyLevel, validate_job_spec


def spec(**overrides) -> JobSpec:
    base = dict(
        tenant="acme",
        queue="research",
        name="llama-8b",
        roles=[Role(name="trainer", replicas=4, gpus_per_replica=8)],
        image="registry/train:1",
    )
    return JobSpec(**{**base, **overrides})


def test_an_rl_job_with_trainer_and_rollout_roles_is_valid_and_counts_its_gang() -> None:
    rl = spec(
        roles=[
            Role(
                name="trainer", replicas=4, gpus_per_replica=8, topology=TopologyConstraint(TopologyLevel.NVLINK, True)
            ),
            Role(name="rollout", replicas=16, gpus_per_replica=1),
        ],
        topology=TopologyConstraint(TopologyLevel.BLOCK, required=True),
    )
    assert validate_job_spec(rl) == []
    assert rl.total_gpus == 48
    assert rl.replica_count == 20


@pytest.mark.parametrize(
    ("overrides", "field", "words"),
    [
        pytest.param(
            {"tenant": "Acme Corp"}, "tenant", "not a valid name", id="a tenant with spaces and capitals is refused"
        ),
        pytest.param({"roles": []}, "roles", "at least one role", id="a job without roles is refused"),
        pytest.param(
            {"roles": [Role(name="t", replicas=0)]},
            "roles[0].replicas",
            "between 1 and",
            id="zero replicas is refused and names the role",
        ),
        pytest.param(
            {"roles": [Role(name="t", gpus_per_replica=100)]},
            "roles[0].gpus_per_replica",
            "between 1 and 72",
            id="more GPUs per replica than any NVLink domain holds is refused",
        ),
        pytest.param(
            {"roles": [Role(name="t"), Role(name="t")]},
            "roles[1].name",
            "used twice",
            id="two roles with one name are refused",
        ),
        pytest.param({"max_runtime_s": 0}, "max_runtime_s", "between 1", id="a zero max runtime is refused"),
        pytest.param({"image": None}, "image", "say what to run", id="a job that names nothing to run is refused"),
        pytest.param(
            {"simulated_duration_s": 10.0, "max_runtime_s": 5},
            "simulated_duration_s",
            "max_runtime_s",
            id="a simulated run longer than the max runtime is refused",
        ),
        pytest.param(
            {"roles": [Role(name="t", cpu_per_replica=0)]},
            "roles[0].cpu_per_replica",
            "greater than 0",
            id="a replica without CPU is refused",
        ),
        pytest.param(
            {"labels": {"bad key!": "x"}}, "labels.bad key!", "label keys", id="a malformed label key is refused"
        ),
    ],
)
def test_bad_specs_get_a_specific_error(overrides, field, words) -> None:
    errors = validate_job_spec(spec(**overrides))
    assert any(e.field == field and words in e.message for e in errors), errors


def test_every_problem_is_reported_at_once() -> None:
    errors = validate_job_spec(spec(tenant="", queue="", roles=[Role(name="", replicas=0)], max_runtime_s=0))
    assert {e.field for e in errors} >= {"tenant", "queue", "roles[0].name", "roles[0].replicas", "max_runtime_s"}


def test_a_wrong_type_is_refused_at_decode_with_the_json_path() -> None:
    raw = b'{"tenant":"a","queue":"q","roles":[{"name":"t","replicas":"four"}],"image":"x"}'
    with pytest.raises(msgspec.ValidationError, match=r"\$\.roles\[0\]\.replicas"):
        msgspec.json.decode(raw, type=JobSpec)
