"""A tenancy file with several mistakes is answered with all of them at once, each with its path,
and a misspelt key or name with the one meant."""

from __future__ import annotations

import msgspec
import pytest
from test_tenancy_config import SMALL, small

from trainyard.config import ConfigError, TenancyConfig, TenancyConfigError, load_tenancy, validate_tenancy
from trainyard.config.store import parse_and_validate


def test_every_misspelt_key_is_reported_at_once_with_its_path_and_the_key_meant():
    text = (
        SMALL.replace("node_pool: h100", "node_pol: h100")
        .replace("{name: standard, priority: 10}", "{name: standard, priority: 10, premptible: true}")
        .replace("borrowing_limit: 4", "borowing_limit: 4")
        .replace("  - name: org\n", "  - name: org\n    wieght: 2\n")
        .replace("q2, quota: {H100: {nominal: 8}}", "q2, quota: {H100: {nominal: eight}}")
    )
    with pytest.raises(TenancyConfigError) as caught:
        load_tenancy(text)

    assert caught.value.errors == [
        ConfigError("flavors[0].node_pol", "unknown field 'node_pol'; did you mean 'node_pool'?"),
        ConfigError("flavors[0].node_pool", "is required"),
        ConfigError("priority_classes[0].premptible", "unknown field 'premptible'; did you mean 'preemptible'?"),
        ConfigError("organisations[0].wieght", "unknown field 'wieght'; did you mean 'weight'?"),
        ConfigError(
            "organisations[0].teams[0].queues[0].quota.H100.borowing_limit",
            "unknown field 'borowing_limit'; did you mean 'borrowing_limit'?",
        ),
        ConfigError("organisations[0].teams[0].queues[1].quota.H100.nominal", "Expected int, got str"),
    ]


@pytest.mark.parametrize(
    "edits, path, said",
    [
        pytest.param(
            {"organisations/0/teams/0/quota": {"h100": {"nominal": 16}}},
            "organisations[0].teams[0].quota.h100",
            "unknown flavor 'h100'; did you mean 'H100'? known: A100, H100",
            id="a flavor in the wrong case",
        ),
        pytest.param(
            {"default_priority_class": "standrd"},
            "default_priority_class",
            "unknown priority class 'standrd'; did you mean 'standard'? known: best-effort, standard",
            id="a misspelt priority class",
        ),
        pytest.param(
            {"organisations/0/teams/0/queues/0/priority_classes": ["gold"]},
            "organisations[0].teams[0].queues[0].priority_classes[0]",
            "unknown priority class 'gold'; known: best-effort, standard",
            id="a name like no other lists them",
        ),
    ],
)
def test_an_unknown_name_is_answered_with_the_nearest_known_one(edits, path, said):
    problems = validate_tenancy(msgspec.convert(small(**edits), type=TenancyConfig))

    assert ConfigError(path, said) in problems


def test_what_the_rest_of_the_file_means_is_checked_in_the_same_pass_as_its_misspelt_keys():
    text = SMALL.replace("  - name: org\n", "  - name: org\n    wieght: 2\n").replace(
        "quota: {H100: {nominal: 16}}", "quota: {h100: {nominal: 16}}", 1
    )
    with pytest.raises(TenancyConfigError) as caught:
        parse_and_validate(text)

    problems = [str(e) for e in caught.value.errors]
    assert problems[0] == "organisations[0].wieght: unknown field 'wieght'; did you mean 'weight'?"
    assert (
        "organisations[0].teams[0].quota.h100: unknown flavor 'h100'; did you mean 'H100'? known: A100, H100"
        in problems
    )


def test_a_value_that_does_not_fit_leaves_the_meaning_for_the_next_pass():
    with pytest.raises(TenancyConfigError) as caught:
        parse_and_validate(SMALL.replace("priority: 10", "priority: high"))

    assert [e.path for e in caught.value.errors] == ["priority_classes[0].priority"]
