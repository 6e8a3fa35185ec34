"""Subject names.  A subject carries the aggregate and its id, so a stream
keeps per-entity order and per-entity history is one subject filter away.

A job's events are published on ``trainyard.jobs.<tenant>.<job_id>.<writer>``:
the last token names the service allowed to write that kind of event, so the
bus's permissions can give each credential only its own writes (admission
decides, placement places, node agents report runs, health fails runs on lost
nodes).  A decision is fenced on the job's whole history
(:func:`job_history`) with ``Nats-Expected-Last-Subject-Sequence-Subject``."""

from __future__ import annotations

import re

PREFIX = "trainyard"
_TOKEN = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_-]*")

#: Who may write which job events (the last token of a job subject).
WRITERS = ("admission", "placement", "agent", "health")


def token(value: str) -> str:
    """Check that ``value`` is safe as one subject token (no dots or wildcards)."""
    if not isinstance(value, str) or not _TOKEN.fullmatch(value):
        raise ValueError(f"{value!r} cannot be used in a subject: use letters, digits, '_' or '-'")
    return value


def intake(tenant: str) -> str:
    return f"{PREFIX}.intake.{token(tenant)}"


def job(tenant: str, job_id: str, writer: str) -> str:
    """The subject ``writer`` publishes a job event on."""
    if writer not in WRITERS:
        raise ValueError(f"{writer!r} does not write job events; writers are {', '.join(WRITERS)}")
    return f"{PREFIX}.jobs.{token(tenant)}.{token(job_id)}.{writer}"


def job_history(tenant: str, job_id: str) -> str:
    """Every event of one job, whoever wrote it (a filter and a fence)."""
    return f"{PREFIX}.jobs.{token(tenant)}.{token(job_id)}.*"


def job_id_anywhere(job_id: str) -> str:
    """Every event of a job id under any tenant: acceptance is fenced on it,
    so a job id names one job in the whole installation."""
    return f"{PREFIX}.jobs.*.{token(job_id)}.*"


def fence_of(subject: str) -> str:
    """The subject filter a ``Nats-Expected-Last-Subject-Sequence`` check on
    ``subject`` covers: a job's whole history for a job subject, else itself."""
    parts = subject.split(".")
    if len(parts) == 5 and parts[1] == "jobs":
        return ".".join(parts[:4]) + ".*"
    return subject


def entity_id(subject: str) -> str:
    """The job or node id a JOBS or NODES subject is about."""
    parts = subject.split(".")
    return parts[3] if parts[1] == "jobs" and len(parts) > 3 else parts[-1]


def node(cluster: str, node_id: str) -> str:
    return f"{PREFIX}.nodes.{token(cluster)}.{token(node_id)}"


def telemetry(cluster: str, node_id: str) -> str:
    return f"{PREFIX}.telemetry.{token(cluster)}.{token(node_id)}"


def work_orders(cluster: str, node_id: str) -> str:
    """What the run dispatcher orders one node's agent to do (StartRun, SignalRun, StopRun)."""
    return f"{PREFIX}.work.{token(cluster)}.{token(node_id)}.orders"


def work_reports(cluster: str, node_id: str) -> str:
    """What one node's agent reports about the processes of its runs."""
    return f"{PREFIX}.work.{token(cluster)}.{token(node_id)}.reports"


def work_reports_of(cluster: str) -> str:
    """Every node's reports in one cluster (the dispatcher's filter)."""
    return f"{PREFIX}.work.{token(cluster)}.*.reports"


def audit(kind: str) -> str:
    return f"{PREFIX}.audit.{token(kind)}"


def deadletter(stream: str) -> str:
    return f"{PREFIX}.deadletter.{token(stream.lower())}"


INTAKE_ALL = f"{PREFIX}.intake.>"
JOBS_ALL = f"{PREFIX}.jobs.>"
NODES_ALL = f"{PREFIX}.nodes.>"
TELEMETRY_ALL = f"{PREFIX}.telemetry.>"
WORK_ALL = f"{PREFIX}.work.>"
AUDIT_ALL = f"{PREFIX}.audit.>"
DEADLETTER_ALL = f"{PREFIX}.deadletter.>"
