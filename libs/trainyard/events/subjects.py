"""Subject names.  A subject carries the aggregate and its id, so a stream
keeps per-entity order and per-entity history is one subject filter away."""

from __future__ import annotations

import re

PREFIX = "trainyard"
_TOKEN = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]*$")


def token(value: str) -> str:
    """Check that ``value`` is safe as one subject token (no dots or wildcards)."""
    if not _TOKEN.match(value) or "." in value:
        raise ValueError(f"{value!r} cannot be used in a subject: use letters, digits, '_' or '-'")
    return value


def intake(tenant: str) -> str:
    return f"{PREFIX}.intake.{token(tenant)}"


def job(tenant: str, job_id: str) -> str:
    return f"{PREFIX}.jobs.{token(tenant)}.{token(job_id)}"


def node(cluster: str, node_id: str) -> str:
    return f"{PREFIX}.nodes.{token(cluster)}.{token(node_id)}"


def telemetry(cluster: str, node_id: str) -> str:
    return f"{PREFIX}.telemetry.{token(cluster)}.{token(node_id)}"


def audit(kind: str) -> str:
    return f"{PREFIX}.audit.{token(kind)}"


def deadletter(stream: str) -> str:
    return f"{PREFIX}.deadletter.{token(stream.lower())}"


INTAKE_ALL = f"{PREFIX}.intake.>"
JOBS_ALL = f"{PREFIX}.jobs.>"
NODES_ALL = f"{PREFIX}.nodes.>"
TELEMETRY_ALL = f"{PREFIX}.telemetry.>"
AUDIT_ALL = f"{PREFIX}.audit.>"
DEADLETTER_ALL = f"{PREFIX}.deadletter.>"
