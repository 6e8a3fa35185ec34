"""A stack from ``trainyard up`` serves every service's Prometheus metrics on
the port it gave that service, the one its state file records."""

from __future__ import annotations

import time
import urllib.error
import urllib.request

import pytest

from trainyard.local import LocalStack
from trainyard.local.stack import METRICS_SERVICES
from trainyard.local.state import read_state

pytestmark = pytest.mark.e2e

#: One family each service exports (docs/operations.md).
FAMILY = {
    "admission": "trainyard_admission_cycle_seconds",
    "placement": "trainyard_placement_waiting_jobs",
    "health": "trainyard_health_nodes",
    "accounting": "trainyard_ledger_lag_seconds",
}


def scrape(url: str, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.read().decode()
        except (urllib.error.URLError, ConnectionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_each_service_serves_its_metrics_on_its_own_port(stack: LocalStack) -> None:
    stack.write_state()
    state = read_state(stack.data_dir)
    assert state is not None
    assert state.metrics == stack.metrics_urls()
    for name in METRICS_SERVICES:
        assert state.metrics[name] == f"http://127.0.0.1:{stack.metrics_ports[name]}/metrics"
        assert FAMILY[name] in scrape(state.metrics[name]), name
