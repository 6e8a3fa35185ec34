"""Checks of intake commands before admission decides: what can be answered
with a JobRejected, and why the rest is dead-lettered."""

from __future__ import annotations

import json

import pytest

from trainyard.core.admission.commands import (
    cancel_owner_problem,
    cancel_problem,
    job_id_of,
    size_problem,
    subject_tenant,
    submit_errors,
)
from trainyard.domain import JobSpec, Role
from trainyard.domain.limits import MAX_INTAKE_MESSAGE_BYTES

SPEC = JobSpec(tenant="acme", queue="q", roles=[Role(name="t")], image="reg/t:1")


@pytest.mark.parametrize(
    "subject, tenant, words",
    [
        pytest.param("trainyard.intake.acme", "acme", None, id="a tenant's intake subject"),
        pytest.param("trainyard.intake.acme.extra", "acme.extra", "not an intake subject", id="an extra token"),
        pytest.param("trainyard.intake.ACME", "ACME", "not a valid name", id="a tenant that is not a valid name"),
        pytest.param("trainyard.other.acme", "", "not an intake subject", id="another stream's subject"),
    ],
)
def test_the_subject_names_the_tenant_or_says_why_not(subject, tenant, words) -> None:
    got, problem = subject_tenant(subject)
    assert got == tenant
    assert (problem is None) if words is None else (words in problem)


@pytest.mark.parametrize(
    "data, job_id, words",
    [
        pytest.param(
            json.dumps({"type": "SubmitJob", "job_id": "j-1", "spec": 3}).encode(), "j-1", None, id="a usable id"
        ),
        pytest.param(b'{"job_id": "' + b"a" * 65 + b'"}', None, "(65 characters)", id="an id one character too long"),
        pytest.param(b'{"job_id": "j-1\\n"}', None, "not a job id", id="an id with a trailing newline"),
        pytest.param(b'{"job_id": 7}', None, "no job_id", id="an id that is not a string"),
        pytest.param(b'{"a":' * 50_000 + b"1" + b"}" * 50_000, None, "no job_id", id="JSON nested too deeply"),
        pytest.param(b"\xff\xfe garbage", None, "no job_id", id="not JSON at all"),
        pytest.param(b"[1, 2]", None, "no job_id", id="JSON that is not an object"),
    ],
)
def test_a_bad_payload_gives_its_job_id_only_when_the_id_is_usable(data, job_id, words) -> None:
    got, problem = job_id_of(data)
    assert got == job_id
    assert (problem is None) if words is None else (words in problem)


def test_messages_over_the_intake_cap_are_refused_with_both_sizes() -> None:
    assert size_problem(MAX_INTAKE_MESSAGE_BYTES) is None
    problem = size_problem(MAX_INTAKE_MESSAGE_BYTES + 1) or ""
    assert str(MAX_INTAKE_MESSAGE_BYTES + 1) in problem and str(MAX_INTAKE_MESSAGE_BYTES) in problem


def test_submissions_use_the_shared_rules_and_the_subject_tenant() -> None:
    assert submit_errors(SPEC, "j-1", "trainyard.intake.acme", "acme", None) == []
    [error] = submit_errors(SPEC, "j-1", "trainyard.intake.globex", "globex", None)
    assert error.field == "tenant" and "was sent to trainyard.intake.globex" in error.message
    assert [e.field for e in submit_errors(SPEC, "a" * 65, "trainyard.intake.acme", "acme", None)] == ["job_id"]


@pytest.mark.parametrize(
    "job_id, body_tenant, reason, words",
    [
        pytest.param("j-1", "acme", "no longer needed", None, id="a well-formed cancel"),
        pytest.param("a" * 65, "acme", "", "job_id", id="an id one character too long"),
        pytest.param(
            "j-1",
            "globex",
            "",
            "names tenant 'globex' but was sent for tenant 'acme'",
            id="a body tenant that disagrees",
        ),
        pytest.param("j-1", "acme", "x" * 5000, "at most 1024 characters", id="a huge reason"),
        pytest.param("j-1", "acme", "stop\x1b[2J", "U+001B", id="a control character in the reason"),
    ],
)
def test_cancels_are_checked_before_the_job_is_looked_up(job_id, body_tenant, reason, words) -> None:
    problem = cancel_problem("acme", job_id, body_tenant, reason)
    assert (problem is None) if words is None else (words in problem)


def test_a_tenant_may_cancel_only_its_own_jobs() -> None:
    assert cancel_owner_problem("acme", "j-1", "acme") is None
    assert "does not belong to tenant globex" in (cancel_owner_problem("globex", "j-1", "acme") or "")
