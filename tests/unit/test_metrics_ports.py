"""Every service of the stack serves its metrics on a port of its own, and the
shipped Prometheus config scrapes each of them (compose.yaml sets the ports it
names; ``trainyard up`` chooses free ones and keeps them in ports.json)."""

from __future__ import annotations

from pathlib import Path

import yaml

from trainyard.local import LocalStack, StackConfig
from trainyard.local.lock import read_ports
from trainyard.local.stack import METRICS_SERVICES, SERVICES

ROOT = Path(__file__).resolve().parents[2]
SCRAPE = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
COMPOSE = yaml.safe_load((ROOT / "compose.yaml").read_text())


def targets() -> dict[str, str]:
    return {c["job_name"]: c["static_configs"][0]["targets"][0] for c in SCRAPE["scrape_configs"]}


def test_up_gives_every_service_its_own_metrics_port_kept_across_starts(tmp_path: Path) -> None:
    stack = LocalStack(StackConfig(data_dir=str(tmp_path)))
    stack.claim()
    try:
        ports = stack.metrics_ports
        assert set(ports) == set(METRICS_SERVICES) == set(SERVICES) - {"gateway", "emulator"}
        others = [stack.ports[name] for name in ("http", "grpc", "nats", "redis")]
        assert len({*ports.values(), *others}) == len(ports) + len(others)  # all distinct
        for name in SERVICES:
            env = stack.service_env(name)
            set_here = {k for k in env if k.endswith("_METRICS_PORT")} - set(stack.env)
            expected = {f"TRAINYARD_{name.upper()}_METRICS_PORT"} if name in ports else set()
            assert set_here == expected, name
            if name in ports:
                assert env[f"TRAINYARD_{name.upper()}_METRICS_PORT"] == str(ports[name])
        assert {f"{n}-metrics": p for n, p in ports.items()}.items() <= read_ports(tmp_path).items()
        urls = stack.metrics_urls()
        assert set(urls) == set(SERVICES) - {"emulator"}
        assert urls["gateway"] == f"{stack.api_url}/metrics"
    finally:
        stack.lock.release()
    again = LocalStack(StackConfig(data_dir=str(tmp_path)))
    again.claim()
    try:
        assert again.metrics_ports == ports
    finally:
        again.lock.release()


def test_the_prometheus_config_scrapes_each_service_on_the_port_compose_gives_it() -> None:
    jobs = targets()
    assert set(jobs) == {f"trainyard-{name}" for name in SERVICES if name != "emulator"}
    for name in METRICS_SERVICES:
        env = COMPOSE["services"][name]["environment"]
        port = env[f"TRAINYARD_{name.upper()}_METRICS_PORT"]
        assert jobs[f"trainyard-{name}"] == f"{name}:{port}"
        assert env[f"TRAINYARD_{name.upper()}_METRICS_ADDR"] == "0.0.0.0"  # reachable from Prometheus's container
    assert len({jobs[f"trainyard-{n}"].split(":")[1] for n in METRICS_SERVICES}) == len(METRICS_SERVICES)
    gateway = COMPOSE["services"]["gateway"]["environment"]
    assert jobs["trainyard-gateway"] == f"gateway:{gateway['TRAINYARD_GATEWAY_HTTP_PORT']}"
