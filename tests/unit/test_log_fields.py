"""Structured log lines: fields passed with kv() follow the message as
key=value (quoted where needed), or become keys of a JSON line."""

from __future__ import annotations

import json
import logging

import pytest

from trainyard.observability.logs import JsonFormatter, KeyValueFormatter, configure, kv


def record(message: str, **fields: object) -> logging.LogRecord:
    r = logging.LogRecord("trainyard_placement.handlers", logging.INFO, __file__, 1, message, (), None)
    for key, value in kv(**fields).items():
        setattr(r, key, value)
    return r


@pytest.mark.parametrize(
    ("fields", "tail"),
    [
        pytest.param({"job_id": "j1", "run_id": "j1-r1"}, " job_id=j1 run_id=j1-r1", id="plain values as they are"),
        pytest.param({"nodes": ["n1", "n2"]}, " nodes=n1,n2", id="a list joined by commas"),
        pytest.param(
            {"reason": 'gpus: "8" is too many'},
            ' reason="gpus: \\"8\\" is too many"',
            id="spaces and quotes make a JSON string",
        ),
        pytest.param({"run_id": None, "job_id": "j1"}, " job_id=j1", id="None is left out"),
        pytest.param({}, "", id="no fields: the usual line"),
    ],
)
def test_key_value_lines(fields: dict[str, object], tail: str) -> None:
    line = KeyValueFormatter("%(levelname)s %(message)s").format(record("run placed", **fields))
    assert line == "INFO run placed" + tail


def test_json_lines_carry_the_fields_as_keys() -> None:
    entry = json.loads(JsonFormatter("placement").format(record("run placed", job_id="j1", nodes=["n1"], gpus=8)))
    assert (entry["message"], entry["process"], entry["level"]) == ("run placed", "placement", "INFO")
    assert (entry["job_id"], entry["nodes"], entry["gpus"]) == ("j1", "n1", 8)


def test_an_unknown_log_format_is_refused_naming_the_variable() -> None:
    with pytest.raises(ValueError, match="TRAINYARD_LOG_FORMAT"):
        configure("admission", "INFO", "xml")
