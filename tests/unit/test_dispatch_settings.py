"""The run dispatcher's settings: the start timeout and admission's kill margin for executing victims."""

from __future__ import annotations

import pytest

from trainyard.settings import ConfigurationError, load_settings


def test_defaults_and_values_from_the_environment() -> None:
    default = load_settings({})
    assert (default.start_timeout_s, default.preempt_kill_margin_s) == (60.0, 15.0)
    given = load_settings({"TRAINYARD_START_TIMEOUT_S": "5", "TRAINYARD_PREEMPT_KILL_MARGIN_S": "0"})
    assert (given.start_timeout_s, given.preempt_kill_margin_s) == (5.0, 0.0)


@pytest.mark.parametrize(
    ("environ", "variable"),
    [
        pytest.param({"TRAINYARD_START_TIMEOUT_S": "0"}, "TRAINYARD_START_TIMEOUT_S", id="no start timeout at all"),
        pytest.param({"TRAINYARD_START_TIMEOUT_S": "inf"}, "TRAINYARD_START_TIMEOUT_S", id="a run held for ever"),
        pytest.param(
            {"TRAINYARD_PREEMPT_KILL_MARGIN_S": "-1"}, "TRAINYARD_PREEMPT_KILL_MARGIN_S", id="a negative margin"
        ),
    ],
)
def test_a_bad_value_names_its_variable(environ: dict[str, str], variable: str) -> None:
    with pytest.raises(ConfigurationError, match=variable):
        load_settings(environ)
