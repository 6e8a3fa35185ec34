"""compose.yaml: valid against the Compose specification, and wired the way Trainyard needs.

The schema in tests/data/compose-spec.json is the upstream Compose specification schema,
vendored so this test runs offline.
"""

from __future__ import annotations

import copy
import json
import shlex
import tomllib
from pathlib import Path

import jsonschema
import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO_ROOT / "compose.yaml"
SCHEMA_FILE = REPO_ROOT / "tests" / "data" / "compose-spec.json"

# Service processes started as `python -m trainyard_<name>` from services/<name>/.
PYTHON_SERVICES = ["admission", "placement", "health", "accounting", "gateway"]
# Every process built from the Trainyard image, the emulator included.
TRAINYARD_SERVICES = [*PYTHON_SERVICES, "emulator"]
INFRASTRUCTURE = ["nats", "redis"]


@pytest.fixture(scope="module")
def compose() -> dict:
    with COMPOSE_FILE.open(encoding="utf-8") as handle:
        return yaml.safe_load(handle)


@pytest.fixture(scope="module")
def schema() -> dict:
    with SCHEMA_FILE.open(encoding="utf-8") as handle:
        return json.load(handle)


@pytest.fixture(scope="module")
def validator(schema: dict) -> jsonschema.Draft7Validator:
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def command_of(service: dict) -> list[str]:
    """The service's command as an argument list, whichever form compose.yaml uses."""
    command = service.get("command")
    if command is None:
        return []
    if isinstance(command, str):
        return shlex.split(command)
    return list(command)


def error_messages(validator: jsonschema.Draft7Validator, document: dict) -> list[str]:
    return [error.message for error in validator.iter_errors(document)]


# --- the file against the specification ---------------------------------------------------


def test_vendored_schema_is_the_draft_7_compose_specification(schema: dict) -> None:
    assert "draft-07" in schema["$schema"]
    assert schema["title"] == "Compose Specification"
    assert "service" in schema["definitions"]


def test_compose_file_is_valid_against_the_compose_specification(
    compose: dict, validator: jsonschema.Draft7Validator
) -> None:
    assert error_messages(validator, compose) == []


def test_compose_file_defines_exactly_the_expected_services(compose: dict) -> None:
    assert sorted(compose["services"]) == sorted(INFRASTRUCTURE + TRAINYARD_SERVICES)


def broken_ports(document: dict) -> None:
    document["services"]["gateway"]["ports"] = "not a list"


def unknown_top_level_key(document: dict) -> None:
    document["servcies"] = document["services"]


def unknown_depends_on_condition(document: dict) -> None:
    document["services"]["admission"]["depends_on"]["nats"]["condition"] = "service_ready"


def unknown_service_key(document: dict) -> None:
    document["services"]["placement"]["commmand"] = ["python", "-m", "trainyard_placement"]


@pytest.mark.parametrize(
    "break_it",
    [
        pytest.param(broken_ports, id="gateway ports given as a string instead of a list"),
        pytest.param(unknown_top_level_key, id="a misspelt top-level key next to services"),
        pytest.param(unknown_depends_on_condition, id="depends_on with a condition compose does not know"),
        pytest.param(unknown_service_key, id="a misspelt key inside a service"),
    ],
)
def test_validator_rejects_a_broken_compose_file(
    compose: dict, validator: jsonschema.Draft7Validator, break_it
) -> None:
    broken = copy.deepcopy(compose)
    break_it(broken)
    assert error_messages(validator, broken) != []


# --- infrastructure -----------------------------------------------------------------------


def test_nats_runs_with_jetstream_on_and_file_storage_in_a_named_volume(compose: dict) -> None:
    nats = compose["services"]["nats"]
    command = command_of(nats)
    assert {"-js", "--jetstream"} & set(command), command
    store_flag = next(flag for flag in ("-sd", "--store_dir") if flag in command)
    store_dir = command[command.index(store_flag) + 1]
    mounted = {volume.split(":")[1]: volume.split(":")[0] for volume in nats["volumes"]}
    assert mounted.get(store_dir) in compose["volumes"], (store_dir, nats["volumes"])


def test_nats_healthcheck_asks_the_monitoring_port_it_enables(compose: dict) -> None:
    nats = compose["services"]["nats"]
    command = command_of(nats)
    monitor_flag = next(flag for flag in ("-m", "--http_port") if flag in command)
    port = command[command.index(monitor_flag) + 1]
    check = " ".join(nats["healthcheck"]["test"])
    assert f":{port}/healthz" in check, check


@pytest.mark.parametrize(
    ("name", "probe"),
    [
        pytest.param("nats", "/healthz", id="nats is healthy when its monitoring port answers"),
        pytest.param("redis", "redis-cli ping", id="redis is healthy when it answers a ping"),
        pytest.param("gateway", "/healthz", id="the gateway is healthy when its REST API answers"),
    ],
)
def test_service_has_a_healthcheck(compose: dict, name: str, probe: str) -> None:
    test = compose["services"][name]["healthcheck"]["test"]
    assert test[0] in {"CMD", "CMD-SHELL"}, test
    assert probe in " ".join(test[1:]), test


# --- Trainyard processes ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        pytest.param(name, ["python", "-m", f"trainyard_{name}"], id=f"{name} runs its package")
        for name in PYTHON_SERVICES
    ]
    + [pytest.param("emulator", ["trainyard", "emulate", "run"], id="emulator runs the CLI")],
)
def test_every_trainyard_service_has_its_command(compose: dict, name: str, expected) -> None:
    assert command_of(compose["services"][name]) == expected


@pytest.mark.parametrize(
    "name", [pytest.param(name, id=f"{name} is built from the repository Dockerfile") for name in TRAINYARD_SERVICES]
)
def test_trainyard_service_is_built_from_the_root_dockerfile(compose: dict, name: str) -> None:
    build = compose["services"][name]["build"]
    context = REPO_ROOT / (build if isinstance(build, str) else build.get("context", "."))
    dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
    assert context.resolve() == REPO_ROOT
    assert (context / dockerfile).is_file()


@pytest.mark.parametrize(
    "name",
    [pytest.param(name, id=f"{name} starts only once nats and redis are healthy") for name in TRAINYARD_SERVICES],
)
def test_service_waits_for_healthy_nats_and_redis(compose: dict, name: str) -> None:
    depends_on = compose["services"][name]["depends_on"]
    for dependency in INFRASTRUCTURE:
        assert depends_on[dependency]["condition"] == "service_healthy", (name, dependency)


def test_every_service_with_depends_on_waits_for_healthy_dependencies(compose: dict) -> None:
    waiting = {name: service["depends_on"] for name, service in compose["services"].items() if "depends_on" in service}
    assert set(waiting) == set(TRAINYARD_SERVICES)
    for name, depends_on in waiting.items():
        assert isinstance(depends_on, dict), f"{name} lists dependencies without a condition"
        for dependency, options in depends_on.items():
            assert options["condition"] == "service_healthy", (name, dependency)
            assert "healthcheck" in compose["services"][dependency], dependency


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, id=f"{name} reaches nats and redis by their compose host names")
        for name in TRAINYARD_SERVICES
    ],
)
def test_service_environment_points_at_the_compose_infrastructure(compose: dict, name: str) -> None:
    environment = compose["services"][name]["environment"]
    assert environment["TRAINYARD_NATS_URL"] == "nats://nats:4222"
    assert environment["TRAINYARD_REDIS_URL"] == "redis://redis:6379/0"


def test_accounting_ledger_lives_in_a_named_volume(compose: dict) -> None:
    accounting = compose["services"]["accounting"]
    ledger_url = accounting["environment"]["TRAINYARD_LEDGER_URL"]
    assert ledger_url.startswith("sqlite:////"), ledger_url
    ledger_dir = str(Path(ledger_url.removeprefix("sqlite:///")).parent)
    mounted = {volume.split(":")[1]: volume.split(":")[0] for volume in accounting["volumes"]}
    assert mounted.get(ledger_dir) in compose["volumes"], (ledger_dir, accounting["volumes"])


def test_gateway_publishes_the_ports_it_is_told_to_listen_on(compose: dict) -> None:
    gateway = compose["services"]["gateway"]
    environment = gateway["environment"]
    http_port = str(environment["TRAINYARD_GATEWAY_HTTP_PORT"])
    grpc_port = str(environment["TRAINYARD_GATEWAY_GRPC_PORT"])
    assert (http_port, grpc_port) == ("8080", "50051")
    published = {str(port).rsplit(":", 1)[-1] for port in gateway["ports"]}
    assert {http_port, grpc_port} <= published, gateway["ports"]
    assert f"localhost:{http_port}/healthz" in " ".join(gateway["healthcheck"]["test"])


def test_named_volumes_used_by_services_are_declared(compose: dict) -> None:
    declared = set(compose.get("volumes") or {})
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if not source.startswith((".", "/", "~")):
                assert source in declared, (name, source)


@pytest.mark.parametrize(
    "name",
    [pytest.param(name, id=f"python -m trainyard_{name} has a package in services/{name}") for name in PYTHON_SERVICES],
)
def test_python_module_target_exists_as_a_service_package(compose: dict, name: str) -> None:
    command = command_of(compose["services"][name])
    module = command[command.index("-m") + 1]
    assert (REPO_ROOT / "services" / name / module).is_dir(), module


def test_emulator_command_is_a_declared_console_script(compose: dict) -> None:
    with (REPO_ROOT / "pyproject.toml").open("rb") as handle:
        scripts = tomllib.load(handle)["project"]["scripts"]
    executable = command_of(compose["services"]["emulator"])[0]
    assert executable in scripts, executable


# --- the locked bus -----------------------------------------------------------------------


def mounts_of(service: dict) -> dict[str, str]:
    """Container path -> host path of the service's bind mounts and volumes."""
    return {volume.split(":")[1]: volume.split(":")[0] for volume in service.get("volumes", [])}


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """The names of the files `python -m trainyard.bus config --out deploy/bus` writes."""
    from trainyard.bus.__main__ import main

    out = tmp_path_factory.mktemp("bus")
    assert main(["config", "--out", str(out)]) == 0
    return {path.name for path in out.iterdir()}


@pytest.mark.parametrize(
    ("name", "flag"),
    [
        pytest.param("nats", "-c", id="nats-server reads its users and permissions from the generated file"),
        pytest.param("redis", "--aclfile", id="redis reads its ACL users from the generated file"),
    ],
)
def test_servers_read_the_generated_bus_files(compose: dict, generated: set[str], name: str, flag: str) -> None:
    service = compose["services"][name]
    command = command_of(service)
    inside = command[command.index(flag) + 1]
    host = mounts_of(service)[inside]
    assert host.startswith("./deploy/bus/"), host
    assert Path(host).name in generated, (host, generated)


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, id=f"{name} connects with its own generated NATS and Redis user")
        for name in TRAINYARD_SERVICES
    ],
)
def test_every_trainyard_service_reads_its_own_users(compose: dict, generated: set[str], name: str) -> None:
    env_file = compose["services"][name]["env_file"]
    assert env_file == f"./deploy/bus/{name}.env"
    assert f"{name}.env" in generated


def test_the_generated_bus_files_are_kept_out_of_git() -> None:
    assert "deploy/bus/" in (REPO_ROOT / ".gitignore").read_text().splitlines()
