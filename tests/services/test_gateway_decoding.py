"""A submission that does not fit the job spec is refused naming every
field to fix, with msgspec's message for that value and the nearest field
name for a misspelt key: the same answer for REST, the console's form and
gRPC (whose spec is converted the same way)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from trainyard.domain.job import JobSpec, ValidationError
from trainyard_gateway.decoding import convert, decode_submission
from trainyard_gateway.jobs import InvalidRequest

SPEC: dict[str, Any] = {
    "tenant": "acme",
    "queue": "default",
    "roles": [{"name": "trainer", "replicas": 2, "gpus_per_replica": 8}],
    "simulated_duration_s": 60.0,
}


def spec(**overrides: Any) -> dict[str, Any]:
    return {**SPEC, **overrides}


def refusal(raw: bytes) -> list[ValidationError]:
    with pytest.raises(InvalidRequest) as refused:
        decode_submission(raw)
    return refused.value.errors


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        pytest.param({k: v for k, v in SPEC.items() if k != "queue"}, "queue", "is required", id="a missing field"),
        pytest.param(spec(roles=[{"replicas": 2}]), "roles[0].name", "is required", id="a missing field of a role"),
        pytest.param(
            spec(topology={"required": True}),
            "topology.level",
            "is required",
            id="a missing field of an optional object",
        ),
        pytest.param(
            spec(roles=[{"name": "t", "replicas": "two"}]),
            "roles[0].replicas",
            "Expected int, got str",
            id="a number given as text",
        ),
        pytest.param(
            spec(roles=[{"name": "a"}, {"name": "b", "gpus_per_replica": 1.5}]),
            "roles[1].gpus_per_replica",
            "Expected int, got float",
            id="the second role",
        ),
        pytest.param(spec(roles="trainer"), "roles", "Expected array, got str", id="a list given as text"),
        pytest.param(spec(roles=[3]), "roles[0]", "Expected object, got int", id="a role that is not an object"),
        pytest.param(spec(topology=3), "topology", "Expected object | null, got int", id="an optional object"),
        pytest.param(
            spec(topology={"level": "galaxy"}),
            "topology.level",
            "Invalid enum value 'galaxy'; use one of nvlink, rack, block, zone",
            id="an unknown enum value",
        ),
        pytest.param(
            spec(roles=[{"name": "t", "topology": {"level": "galaxy"}}]),
            "roles[0].topology.level",
            "Invalid enum value 'galaxy'; use one of nvlink, rack, block, zone",
            id="an enum inside a role",
        ),
        pytest.param(
            spec(simulated_duration_s=-1),
            "simulated_duration_s",
            "Expected float >= 0.0",
            id="a constraint of an optional number",
        ),
        pytest.param(spec(labels={"team": 1}), "labels.team", "Expected str, got int", id="a label value"),
        pytest.param(spec(command=["torchrun", 2]), "command[1]", "Expected str, got int", id="an item of a list"),
        pytest.param(spec(job_id=5), "job_id", "Expected str | null, got int", id="the job id"),
        pytest.param([1, 2], "body", "Expected object, got array", id="a body that is not an object"),
        pytest.param(None, "body", "Expected object, got null", id="null"),
    ],
)
def test_the_field_that_does_not_fit_is_named_with_msgspecs_message(body: Any, field: str, message: str) -> None:
    assert refusal(json.dumps(body).encode()) == [ValidationError(field, message)]


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        pytest.param(b"{not json", "the body is not valid JSON", id="not JSON"),
        pytest.param(b"", "the body is not valid JSON", id="empty"),
        pytest.param(b'{"tenant": "acme"} x', "the body is not valid JSON", id="something after the object"),
        pytest.param(
            json.dumps(spec())[:-1].encode() + b', "x": ' + b"[" * 5000 + b"]" * 5000 + b"}",
            "nested too deeply",
            id="nesting in an unknown field",
        ),
    ],
)
def test_a_body_that_is_not_json_names_the_body(raw: bytes, says: str) -> None:
    (error,) = refusal(raw)
    assert error.field == "body" and says in error.message


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        pytest.param(json.dumps(spec())[:-1].encode() + b', "max_runtime_s": 1e400}', "max_runtime_s", id="a field"),
        pytest.param(
            b'{"tenant": "acme", "queue": "q", "roles": [{"name": "t", "replicas": 1e999}]}',
            "roles[0].replicas",
            id="a role's field",
        ),
    ],
)
def test_a_number_too_large_for_a_float_is_refused_where_it_is(raw: bytes, field: str) -> None:
    assert refusal(raw) == [ValidationError(field, "Number out of range")]


def test_a_body_that_fits_is_decoded() -> None:
    body = decode_submission(json.dumps(spec(job_id="run-1")).encode())

    assert body.job_id == "run-1" and body.job_spec().roles[0].gpus_per_replica == 8


def test_every_problem_is_listed_at_once_in_the_order_the_body_gives_them() -> None:
    body = spec(queue=3, roles=[{"name": 1, "gpus_per_replcia": 8}], priorty_class="standard")

    assert refusal(json.dumps(body).encode()) == [
        ValidationError("queue", "Expected str, got int"),
        ValidationError("roles[0].name", "Expected str, got int"),
        ValidationError(
            "roles[0].gpus_per_replcia", "unknown field 'gpus_per_replcia'; did you mean 'gpus_per_replica'?"
        ),
        ValidationError("priorty_class", "unknown field 'priorty_class'; did you mean 'priority_class'?"),
    ]


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        pytest.param(
            spec(roles=[{"name": "t", "gpus": 8}]),
            "roles[0].gpus",
            "unknown field 'gpus'; did you mean 'gpus_per_replica'?",
            id="a misspelt field of a role",
        ),
        pytest.param(
            spec(topology={"level": "rack", "requird": True}),
            "topology.requird",
            "unknown field 'requird'; did you mean 'required'?",
            id="a misspelt field of the topology",
        ),
        pytest.param(
            spec(nonsense={"x": 1}),
            "nonsense",
            "unknown field 'nonsense'; known: checkpoint_dir, command,",
            id="a field like no other lists the fields",
        ),
    ],
)
def test_an_unknown_field_is_refused_with_the_nearest_one(body: Any, field: str, message: str) -> None:
    (error,) = refusal(json.dumps(body).encode())

    assert error.field == field and error.message.startswith(message)


def test_a_converted_spec_names_the_whole_by_its_root() -> None:
    with pytest.raises(InvalidRequest) as refused:
        convert("not a spec", JobSpec, root="spec")

    assert refused.value.errors == [ValidationError("spec", "Expected object, got str")]
