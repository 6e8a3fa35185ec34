"""Every ``TRAINYARD_*`` setting comes from trainyard.settings: what the loader
reads from a given environment, its defaults, and the command line's
preference for a variable that is set over the running stack's state."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import msgspec
import pytest

from trainyard.cli.client import resolve_api_url, resolve_token, use_token
from trainyard.cli.config import nats_url
from trainyard.cli.finance import _ledger_url
from trainyard.local.state import StackState, write_state
from trainyard.runtime import run_loop
from trainyard.settings import ConfigurationError, Settings, load_settings, variable
from trainyard.sim.workloads import traces_dir

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("variable", "value", "field", "expected"),
    [
        pytest.param("TRAINYARD_TRACES", "/data/traces", "traces", "/data/traces", id="the simulator's traces folder"),
        pytest.param(
            "TRAINYARD_API_URL", "http://gw:8080", "api_url", "http://gw:8080", id="the gateway the command line calls"
        ),
        pytest.param("TRAINYARD_TOKEN", "ty_abc", "token", "ty_abc", id="the command line's API token"),
        pytest.param(
            "TRAINYARD_PROFILE_DIR", "/tmp/prof", "profile_dir", "/tmp/prof", id="where a service writes its profile"
        ),
        pytest.param("TRAINYARD_RATE_CARD", "/etc/ty/card.yaml", "rate_card", "/etc/ty/card.yaml", id="the rate card"),
        pytest.param(
            "TRAINYARD_COST_CENTRES", "/etc/ty/cc.yaml", "cost_centres", "/etc/ty/cc.yaml", id="the cost-centre map"
        ),
        pytest.param("TRAINYARD_PLACEMENT_BINDER", "kube", "placement_binder", "kube", id="placement's binder"),
        pytest.param(
            "TRAINYARD_HEALTH_POLICY",
            '{"flap_limit": 3}',
            "health_policy",
            '{"flap_limit": 3}',
            id="health's policy overrides",
        ),
        pytest.param("TRAINYARD_HEALTH_KUBE_TAINTS", "1", "health_kube_taints", "1", id="health's Kubernetes taints"),
        pytest.param(
            "TRAINYARD_ADMISSION_METRICS_PORT", "9101", "admission_metrics_port", 9101, id="admission's metrics port"
        ),
        pytest.param(
            "TRAINYARD_PLACEMENT_METRICS_PORT", "9102", "placement_metrics_port", 9102, id="placement's metrics port"
        ),
        pytest.param("TRAINYARD_HEALTH_METRICS_PORT", "9103", "health_metrics_port", 9103, id="health's metrics port"),
        pytest.param(
            "TRAINYARD_ACCOUNTING_METRICS_PORT", "9104", "accounting_metrics_port", 9104, id="accounting's metrics port"
        ),
        pytest.param(
            "TRAINYARD_HEALTH_METRICS_ADDR",
            "",
            "health_metrics_addr",
            "",
            id="an empty metrics address: every interface",
        ),
        pytest.param("TRAINYARD_CLUSTER", "east", "cluster", "east", id="the cluster fault injection addresses"),
        pytest.param(
            "TRAINYARD_REDIS_PREFIX", "ty2:", "redis_prefix", "ty2:", id="the Redis prefix the capacity report reads"
        ),
        pytest.param(
            "TRAINYARD_LEDGER_URL", "sqlite:////srv/l.db", "ledger_url", "sqlite:////srv/l.db", id="the ledger"
        ),
        pytest.param(
            "TRAINYARD_EVENT_LOOP", "asyncio", "event_loop", "asyncio", id="the standard library's event loop"
        ),
    ],
)
def test_the_loader_reads_each_setting_from_the_environment_it_is_given(
    variable: str, value: str, field: str, expected: object
) -> None:
    settings = load_settings({variable: value})

    assert getattr(settings, field) == expected
    assert settings.from_environment == {field}


def test_unset_settings_keep_their_documented_defaults() -> None:
    settings = load_settings({})

    assert (settings.traces, settings.api_url, settings.token, settings.profile_dir) == ("", "", "", "")
    assert (settings.rate_card, settings.cost_centres, settings.health_policy, settings.health_kube_taints) == (
        "",
        "",
        "",
        "",
    )
    assert settings.placement_binder == "none"
    assert [settings.metrics_endpoint(s) for s in ("admission", "placement", "health", "accounting")] == [
        ("127.0.0.1", 0)
    ] * 4
    assert settings.from_environment == frozenset()
    assert settings.given("nats_url") == "" and settings.nats_url == Settings().nats_url


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        pytest.param(
            {"TRAINYARD_PLACEMENT_METRICS_PORT": "nine"},
            "TRAINYARD_PLACEMENT_METRICS_PORT: Expected `int`",
            id="a port that is not a number names its variable",
        ),
        pytest.param(
            {"TRAINYARD_HEARTBEAT_INTERVAL_S": "soon"},
            "TRAINYARD_HEARTBEAT_INTERVAL_S: Expected `float`",
            id="a duration that is not a number names its variable",
        ),
        pytest.param(
            {"TRAINYARD_EVENT_LOOP": "trio"},
            "TRAINYARD_EVENT_LOOP: 'trio' is not an event loop; use one of uvloop, asyncio",
            id="an unknown event loop names the ones there are",
        ),
        pytest.param(
            {"TRAINYARD_JOB_RETENTION_S": "0"},
            r"TRAINYARD_JOB_RETENTION_S must be a number of seconds above 0 \(default 604800: 7 days\)",
            id="a retention of no time would forget a job as it finishes",
        ),
        pytest.param(
            {"TRAINYARD_JOB_RETENTION_S": "inf"},
            "TRAINYARD_JOB_RETENTION_S must be a number of seconds above 0",
            id="an endless retention is not a retention",
        ),
        pytest.param(
            {"TRAINYARD_RETENTION_SWEEP_INTERVAL_S": "-5"},
            "TRAINYARD_RETENTION_SWEEP_INTERVAL_S must be a number of seconds above 0",
            id="a sweep interval below zero",
        ),
        pytest.param(
            {"TRAINYARD_JOBS_SNAPSHOT_INTERVAL_S": "0"},
            "TRAINYARD_JOBS_SNAPSHOT_INTERVAL_S must be a number of seconds above 0",
            id="a snapshot interval of zero",
        ),
    ],
)
def test_a_bad_value_stops_the_process_naming_the_variable(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        load_settings(environ)


@pytest.mark.parametrize(("name", "loop_module"), [("uvloop", "uvloop"), ("asyncio", "asyncio")])
def test_a_service_runs_on_the_event_loop_its_settings_name(name: str, loop_module: str) -> None:
    async def which() -> str:
        return type(asyncio.get_running_loop()).__module__.split(".")[0]

    assert run_loop(load_settings({"TRAINYARD_EVENT_LOOP": name}), which()) == loop_module


def test_an_empty_number_is_unset_and_an_empty_text_is_empty() -> None:
    settings = load_settings({"TRAINYARD_HEALTH_METRICS_PORT": "", "TRAINYARD_LEDGER_URL": ""})

    assert settings.health_metrics_port == 0
    assert settings.ledger_url == ""  # the gateway serves no usage
    assert settings.from_environment == {"ledger_url"}


def test_the_operations_guide_lists_every_setting_and_no_other() -> None:
    guide = (ROOT / "docs" / "operations.md").read_text()
    table = guide.split("\n## Settings\n", 1)[1].split("\n## ", 1)[0]
    first_cells = [line.split("|")[1] for line in table.splitlines() if line.startswith("| `TRAINYARD_")]
    listed = set(re.findall(r"TRAINYARD_[A-Z0-9_]+", " ".join(first_cells)))

    fields = {variable(f.name) for f in msgspec.structs.fields(Settings) if f.name != "from_environment"}
    assert sorted(fields - listed) == [], "not in docs/operations.md's settings table"
    assert sorted(listed - fields) == [], "in docs/operations.md's settings table but not a setting"


# --- the readers behind the settings, through this process's environment ------------------------------


def running_stack(data_dir: Path) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    write_state(
        data_dir,
        StackState(
            api_url="http://127.0.0.1:18080",
            grpc_target="127.0.0.1:15051",
            nats_url="nats://127.0.0.1:14222",
            redis_url="redis://127.0.0.1:16379/0",
            ledger_url="sqlite:////stack/ledger.db",
            pid=1,
        ),
    )


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in (
        "TRAINYARD_API_URL",
        "TRAINYARD_TOKEN",
        "TRAINYARD_NATS_URL",
        "TRAINYARD_LEDGER_URL",
        "TRAINYARD_TRACES",
    ):
        monkeypatch.delenv(name, raising=False)
    use_token(None)
    return monkeypatch


@pytest.mark.parametrize(
    ("variable", "value", "read"),
    [
        pytest.param("TRAINYARD_API_URL", "http://gw:8080", lambda d: resolve_api_url(None, d), id="the gateway"),
        pytest.param("TRAINYARD_NATS_URL", "nats://bus:4222", nats_url, id="the bus of `trainyard config`"),
        pytest.param(
            "TRAINYARD_LEDGER_URL",
            "sqlite:////srv/l.db",
            lambda d: _ledger_url(None, d),
            id="the ledger of the reports",
        ),
    ],
)
def test_the_command_line_prefers_a_variable_that_is_set_to_the_running_stack(
    clean_environment: pytest.MonkeyPatch, tmp_path: Path, variable: str, value: str, read
) -> None:
    running_stack(tmp_path)
    from_stack = read(str(tmp_path))

    clean_environment.setenv(variable, value)

    assert from_stack != value
    assert read(str(tmp_path)) == value


def test_the_command_line_token_and_traces_come_from_the_environment(
    clean_environment: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clean_environment.setenv("TRAINYARD_TOKEN", " ty_secret ")
    clean_environment.setenv("TRAINYARD_TRACES", str(tmp_path / "traces"))

    assert resolve_token(None, str(tmp_path)) == "ty_secret"
    assert traces_dir() == tmp_path / "traces"
