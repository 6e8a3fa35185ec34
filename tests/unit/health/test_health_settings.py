"""Health's settings from the environment: policy overrides and the metrics port."""

from __future__ import annotations

import pytest

from trainyard.settings import ConfigurationError, load_settings
from trainyard_health.main import load_policy
from trainyard_health.metrics import HealthMetrics


@pytest.mark.parametrize(
    "raw, field, value",
    [
        pytest.param(None, "blast_radius_max_share", 0.1, id="no override keeps the defaults"),
        pytest.param('{"blast_radius_max_share": 0.25}', "blast_radius_max_share", 0.25, id="one field overridden"),
        pytest.param(
            '{"rack_fault_min_nodes": 1000}', "rack_fault_min_nodes", 1000, id="rack correlation effectively off"
        ),
    ],
)
def test_policy_overrides(raw, field, value) -> None:
    env = {} if raw is None else {"TRAINYARD_HEALTH_POLICY": raw}
    assert getattr(load_policy(load_settings(env)), field) == value


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param("{", id="not JSON"),
        pytest.param('{"blast_radius_max_share": 2}', id="an impossible share"),
        pytest.param('{"flap_limit": "often"}', id="a wrong type"),
    ],
)
def test_bad_policies_refuse_to_start(raw) -> None:
    with pytest.raises(ConfigurationError, match="TRAINYARD_HEALTH_POLICY"):
        load_policy(load_settings({"TRAINYARD_HEALTH_POLICY": raw}))


def test_metrics_are_off_unless_a_port_is_given() -> None:
    assert HealthMetrics().serve(load_settings({})) == 0
    with pytest.raises(ConfigurationError, match="TRAINYARD_HEALTH_METRICS_PORT"):
        load_settings({"TRAINYARD_HEALTH_METRICS_PORT": "http"})
