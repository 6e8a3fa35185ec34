"""deploy/nats-cluster.compose.yaml: valid Compose, and three routed JetStream
nodes that every Trainyard process is told about."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
OVERRIDE = REPO_ROOT / "deploy" / "nats-cluster.compose.yaml"
NODES = {"nats": "nats-1", "nats-2": "nats-2", "nats-3": "nats-3"}
TRAINYARD_SERVICES = ["admission", "placement", "health", "accounting", "gateway", "emulator"]


@pytest.fixture(scope="module")
def override() -> dict:
    return yaml.safe_load(OVERRIDE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def base() -> dict:
    return yaml.safe_load((REPO_ROOT / "compose.yaml").read_text(encoding="utf-8"))


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_the_override_is_valid_against_the_compose_specification(override: dict) -> None:
    schema = json.loads((REPO_ROOT / "tests" / "data" / "compose-spec.json").read_text(encoding="utf-8"))
    assert [e.message for e in jsonschema.Draft7Validator(schema).iter_errors(override)] == []


def test_three_nodes_with_their_own_names_and_data_route_to_each_other(override: dict, base: dict) -> None:
    services = override["services"]
    routes = {flag(services[s]["command"], "--routes") for s in NODES}
    assert routes == {"nats://nats:6222,nats://nats-2:6222,nats://nats-3:6222"}
    assert {flag(services[s]["command"], "--server_name") for s in NODES} == set(NODES.values())
    volumes = {**base["volumes"], **override["volumes"]}
    stores = set()
    for name in NODES:
        command = services[name]["command"]
        assert "-js" in command and flag(command, "-c") == "/etc/nats/nats.conf"  # the locked bus's users
        mounts = services[name].get("volumes") or base["services"][name]["volumes"]
        store = next(v.split(":")[0] for v in mounts if v.split(":")[1] == flag(command, "-sd"))
        assert store in volumes
        stores.add(store)
    assert len(stores) == 3, "each node keeps its data in a volume of its own"


@pytest.mark.parametrize("name", TRAINYARD_SERVICES)
def test_every_trainyard_process_is_given_every_node_and_three_replicas(override: dict, base: dict, name: str) -> None:
    assert name in base["services"]
    environment = override["services"][name]["environment"]
    assert environment["TRAINYARD_NATS_URL"].split(",") == [f"nats://{n}:4222" for n in NODES]
    assert environment["TRAINYARD_STREAM_REPLICAS"] == "3"
