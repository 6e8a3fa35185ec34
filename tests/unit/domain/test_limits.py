"""Size caps and whole-string name rules: every way in (REST, gRPC, intake)
applies the same checks, each refusal names the field and stays small."""

from __future__ import annotations

import math

import msgspec
import pytest

from trainyard.domain import JobSpec, Role, validate_job_id, validate_job_spec, validate_submission
from trainyard.domain.limits import (
    GPU_TYPE_RE,
    JOB_ID_RE,
    LABEL_KEY_RE,
    MAX_COMMAND_CHARS,
    MAX_COMMAND_ITEMS,
    MAX_ERRORS_LISTED,
    MAX_IMAGE_CHARS,
    MAX_LABEL_VALUE_CHARS,
    MAX_SPEC_BYTES,
    MAX_WORKLOAD_REF_CHARS,
    NAME_RE,
    job_id_problem,
    name_problem,
    quoted,
)


def spec(**overrides) -> JobSpec:
    base = dict(tenant="acme", queue="research", roles=[Role(name="trainer", gpus_per_replica=8)], image="reg/t:1")
    return JobSpec(**{**base, **overrides})


def only(errors, field: str) -> list[str]:
    return [e.message for e in errors if e.field == field]


@pytest.mark.parametrize(
    "pattern, value",
    [
        pytest.param(NAME_RE, "acme\n", id="a name with a trailing newline"),
        pytest.param(JOB_ID_RE, "j-1\n", id="a job id with a trailing newline"),
        pytest.param(LABEL_KEY_RE, "team\n", id="a label key with a trailing newline"),
        pytest.param(GPU_TYPE_RE, "H100\n", id="a GPU type with a trailing newline"),
        pytest.param(NAME_RE, "acme!", id="a name with a bad last character"),
        pytest.param(JOB_ID_RE, "a" * 65, id="a job id of 65 characters"),
    ],
)
def test_patterns_match_whole_strings_with_match_and_fullmatch(pattern, value) -> None:
    assert pattern.match(value) is None and pattern.fullmatch(value) is None


@pytest.mark.parametrize(
    "job_id, words",
    [
        pytest.param("a" * 65, "(65 characters)", id="65 characters are one too many"),
        pytest.param("j-1\n", "not a job id", id="a trailing newline is refused"),
        pytest.param("", "not a job id", id="an empty id is refused"),
        pytest.param("a.b", "not a job id", id="a dot would split a subject token"),
        pytest.param("j>", "not a job id", id="a wildcard is refused"),
        pytest.param("jöb", "not a job id", id="letters outside ASCII are refused"),
        pytest.param(42, "is a string", id="a number is not a job id"),
    ],
)
def test_job_ids_break_the_rule_with_a_reason(job_id, words) -> None:
    [error] = validate_job_id(job_id)
    assert error.field == "job_id" and words in error.message


def test_a_64_character_job_id_is_the_longest_allowed() -> None:
    assert validate_job_id("a" * 64) == [] and job_id_problem("a" * 64) is None
    assert validate_submission(spec(), "a" * 64) == []
    assert only(validate_submission(spec(), "a" * 65), "job_id")
    assert validate_submission(spec(), None) == []  # an id is generated


@pytest.mark.parametrize(
    "overrides, field, words",
    [
        pytest.param(
            {"image": "r/" + "x" * MAX_IMAGE_CHARS}, "image", f"at most {MAX_IMAGE_CHARS}", id="a huge image reference"
        ),
        pytest.param({"image": "reg/t:1 --privileged"}, "image", "white space", id="an image with a space"),
        pytest.param({"image": "reg/t:1\n"}, "image", "U+000A", id="an image with a newline"),
        pytest.param({"image": ""}, "image", "must not be empty", id="an empty image"),
        pytest.param(
            {"workload_ref": "s3://" + "x" * MAX_WORKLOAD_REF_CHARS},
            "workload_ref",
            "at most",
            id="a huge workload reference",
        ),
        pytest.param(
            {"command": ["x"] * (MAX_COMMAND_ITEMS + 1)},
            "command",
            f"at most {MAX_COMMAND_ITEMS} items",
            id="too many command items",
        ),
        pytest.param(
            {"command": ["python", "y" * (MAX_COMMAND_CHARS + 1)]},
            "command",
            f"at most {MAX_COMMAND_CHARS} characters",
            id="a command too long in all",
        ),
        pytest.param({"command": ["python", "a\x00b"]}, "command[1]", "U+0000", id="a NUL in a process argument"),
        pytest.param(
            {"labels": {"team": "x" * (MAX_LABEL_VALUE_CHARS + 1)}}, "labels.team", "at most", id="a long label value"
        ),
        pytest.param({"labels": {"team": "a\rb"}}, "labels.team", "U+000D", id="a control character in a label value"),
        pytest.param({"labels": {"team\n": "x"}}, "labels.team\n", "label keys", id="a label key with a newline"),
        pytest.param({"name": "job\n"}, "name", "not a valid name", id="a job name with a trailing newline"),
        pytest.param({"tenant": "acme\n"}, "tenant", "not a valid name", id="a tenant with a trailing newline"),
        pytest.param(
            {"roles": [Role(name="t", cpu_per_replica=math.inf)]},
            "roles[0].cpu_per_replica",
            "at most",
            id="infinite CPUs (JSON would carry null)",
        ),
        pytest.param(
            {"roles": [Role(name="t", memory_gib_per_replica=math.nan)]},
            "roles[0].memory_gib_per_replica",
            "greater than 0",
            id="memory that is not a number",
        ),
        pytest.param(
            {"simulated_duration_s": 1.0, "simulated_checkpoint_interval_s": math.inf},
            "simulated_checkpoint_interval_s",
            "number of seconds",
            id="an infinite checkpoint interval",
        ),
        pytest.param(
            {"command": ["\U0001f600" * 8000] * 4},
            "spec",
            f"at most {MAX_SPEC_BYTES}",
            id="a spec over 64 KiB as JSON with every field within its own cap (4-byte characters)",
        ),
    ],
)
def test_caps_refuse_with_the_field_to_fix(overrides, field, words) -> None:
    errors = validate_job_spec(spec(**overrides))
    assert any(words in m for m in only(errors, field)), errors


def test_a_spec_at_the_caps_is_valid_and_under_the_spec_size_cap() -> None:
    big = spec(
        image="r/" + "i" * (MAX_IMAGE_CHARS - 2),
        command=["c" * 1000] * 16,
        labels={f"k{i}": "v" * MAX_LABEL_VALUE_CHARS for i in range(64)},
        workload_ref="s3://" + "w" * 900,
    )
    assert validate_job_spec(big) == []
    assert len(msgspec.json.encode(big)) <= MAX_SPEC_BYTES


def test_a_huge_value_is_quoted_short_in_its_error() -> None:
    huge = "Q" * 500_000
    errors = validate_job_spec(spec(name=huge, labels={huge: huge}, image=huge))
    assert errors
    assert all(len(e.message) < 400 and len(e.field) < 100 for e in errors), [len(e.message) for e in errors]
    assert "(500000 characters)" in only(errors, "name")[0]


def test_a_spec_with_thousands_of_problems_lists_a_bounded_number() -> None:
    errors = validate_job_spec(spec(labels={f"bad key {i}": "x" for i in range(5000)}))
    assert len(errors) == MAX_ERRORS_LISTED
    assert errors[-1].field == "spec" and "more problems not listed" in errors[-1].message


def test_newlines_and_tabs_are_allowed_inside_a_command_script() -> None:
    assert validate_job_spec(spec(command=["bash", "-c", "set -e\n\tpython train.py"])) == []


def test_quoting_and_name_problems_stay_short_and_say_what_to_use() -> None:
    assert quoted("x" * 10) == "'xxxxxxxxxx'"
    assert quoted("x" * 1000).endswith("... (1000 characters)")
    assert name_problem("acme") is None
    assert "lowercase letters" in (name_problem("Acme") or "")
