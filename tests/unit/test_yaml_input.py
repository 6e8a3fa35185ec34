"""YAML handed in by people is refused when aliases expand it past a bound or make it contain itself,
before anything walks the expanded values; every reader of such files uses the same check."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from typer.testing import CliRunner

from trainyard.cli.main import app
from trainyard.config import TenancyConfigError, load_tenancy
from trainyard.core.accounting import RateCardError
from trainyard.ledger.finance_config import read_rate_card
from trainyard.yaml_input import YamlTooLarge, check_yaml


def laughs(levels: int, key: str = "labels") -> str:
    """A document of a few hundred bytes whose ``key`` expands to 10**levels strings."""
    lines = ['l0: &l0 ["x","x","x","x","x","x","x","x","x","x"]']
    lines += [f"l{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, levels)]
    return "\n".join([*lines, f"{key}: *l{levels - 1}", ""])


def test_a_billion_laughs_is_refused_without_being_expanded() -> None:
    text = laughs(9)  # 10**9 values in 500 bytes
    assert len(text) < 1000
    with pytest.raises(YamlTooLarge, match="expands to more than 100,000 values through YAML aliases"):
        check_yaml(text, "the job spec")


def test_a_document_that_contains_itself_is_refused() -> None:
    with pytest.raises(YamlTooLarge, match="contains itself through a YAML alias"):
        check_yaml("tenant: acme\nroles: &r [1, *r]\n")
    with pytest.raises(YamlTooLarge, match="contains itself"):
        check_yaml("a: &m {b: {c: *m}}\n")


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(laughs(4), id="aliases expanding to 10,000 values"),
        pytest.param("base: &b {gpus: 8}\nroles: [*b, *b, *b]\n", id="a shared block"),
        pytest.param("tenant: acme\nqueue: default\n", id="no aliases"),
        pytest.param("", id="empty"),
        pytest.param("a: [unclosed", id="not YAML: left to the decoder"),
    ],
)
def test_ordinary_documents_pass(text: str) -> None:
    check_yaml(text)


def test_a_long_document_without_aliases_is_not_mistaken_for_one_that_expands() -> None:
    written_out = "labels: [" + ", ".join(["x"] * 1_500) + "]\n"  # 1,502 values, no alias
    check_yaml(written_out, limit=1_000)
    with pytest.raises(YamlTooLarge):
        check_yaml("a: &a [" + ", ".join(["x"] * 500) + "]\nb: [*a, *a, *a]\n", limit=1_000)


def test_the_bound_counts_every_expanded_value_once_per_use() -> None:
    # the mapping, its 5 keys, l0..l3 (11 + 111 + 1,111 + 11,111 values) and labels, l3 again (11,111)
    whole = 1 + 5 + 11 + 111 + 1_111 + 11_111 + 11_111
    check_yaml(laughs(4), limit=whole)
    with pytest.raises(YamlTooLarge):
        check_yaml(laughs(4), limit=whole - 1)


def test_a_tenancy_file_of_laughs_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(TenancyConfigError, match="the tenancy file expands to more than"):
        load_tenancy(laughs(9, key="organisations"))


def test_a_rate_card_of_laughs_is_a_rate_card_error(tmp_path: Path) -> None:
    card = tmp_path / "card.yaml"
    card.write_text(laughs(9, key="versions"))
    with pytest.raises(RateCardError, match="card.yaml expands to more than"):
        read_rate_card(card)


def test_a_job_spec_of_laughs_fails_in_the_cli_before_anything_is_sent(tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("tenant: acme\nqueue: default\n" + laughs(9))
    result = CliRunner().invoke(app, ["submit", "-f", str(spec), "--api-url", "http://127.0.0.1:9"])
    assert result.exit_code == 1
    assert "expands to more than 100,000 values" in " ".join(result.output.split())


def test_the_check_runs_before_the_decoder_would_build_the_values() -> None:
    """The decoder itself is cheap (aliases are references); what follows it is not: 10**6 values as JSON."""
    text = laughs(6)
    assert len(msgspec.json.encode(msgspec.yaml.decode(text.encode()))) > 5_000_000
    with pytest.raises(YamlTooLarge):
        check_yaml(text)
