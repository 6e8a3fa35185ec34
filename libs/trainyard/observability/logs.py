"""Structured log lines: every state change is logged at INFO with its facts
as ``key=value`` fields (job id, run id, node, decision, ...), so a person can
grep a job's whole life and a log shipper can parse it.

A call site passes the fields with :func:`kv`::

    log.info("job admitted", extra=kv(decision="admitted", job_id=job_id, run_id=run_id))

and the process's formatter appends them: ``... job admitted decision=admitted
job_id=j1 run_id=j1-r1`` (values with spaces, quotes or ``=`` are JSON
strings; None is left out).  ``TRAINYARD_LOG_FORMAT=json`` writes one JSON
object per line instead, with the fields as keys.
"""

from __future__ import annotations

import json
import logging
from typing import Any

#: The LogRecord attribute the fields travel in (one name, so no field can clash with LogRecord's own).
ATTRIBUTE = "trainyard_fields"
FORMATS = ("text", "json")


def kv(**fields: Any) -> dict[str, dict[str, Any]]:
    """The ``extra=`` of a log call carrying ``fields``."""
    return {ATTRIBUTE: fields}


def fields_of(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in getattr(record, ATTRIBUTE, {}).items() if v is not None}


def _text(value: Any) -> str:
    if isinstance(value, (list, tuple, set, frozenset)):
        value = ",".join(str(v) for v in value)
    elif isinstance(value, float):
        value = f"{value:.6g}"
    text = str(value)
    if not text or any(c in text for c in ' ="\\') or not text.isprintable():
        return json.dumps(text)
    return text


class KeyValueFormatter(logging.Formatter):
    """The usual line, then `` key=value`` for each field."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = fields_of(record)
        if not fields:
            return line
        head, nl, rest = line.partition("\n")  # a traceback stays below the fields
        return head + " " + " ".join(f"{k}={_text(v)}" for k, v in fields.items()) + nl + rest


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, process, message and the fields."""

    def __init__(self, process: str) -> None:
        super().__init__()
        self.process = process

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "process": self.process,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in fields_of(record).items():
            entry.setdefault(key, value if isinstance(value, (int, float, bool, str)) else _text(value))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure(process: str, level: str = "INFO", fmt: str = "text") -> None:
    """Log to stderr at ``level`` in the ``fmt`` format ("text" or "json")."""
    if fmt not in FORMATS:
        raise ValueError(f"TRAINYARD_LOG_FORMAT must be one of {', '.join(FORMATS)}, not {fmt!r}")
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter(process))
    else:
        handler.setFormatter(KeyValueFormatter(f"%(asctime)s {process} %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler])
