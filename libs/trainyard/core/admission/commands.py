"""Checks of intake commands, before admission decides on them.

Two kinds of answer.  A problem admission can file under the job (a bad spec,
a tenant that does not match, a class the queue may not use, a job that can
never fit) is a list of :class:`ValidationError` for a ``JobRejected``.  A
message that cannot be answered under any job (too large, sent on a malformed
subject, a job id that breaks the id rule, a cancel for another tenant's job)
gets a problem as text: the reason it is dead-lettered with.
"""

from __future__ import annotations

import msgspec

from trainyard.core.admission.intake import validate_against_tenancy
from trainyard.core.admission.tree import Tenancy
from trainyard.domain.job import JobSpec, ValidationError, validate_submission
from trainyard.domain.limits import (
    MAX_INTAKE_MESSAGE_BYTES,
    MAX_REASON_CHARS,
    job_id_problem,
    name_problem,
    quoted,
    text_problem,
)

INTAKE_PREFIX = "trainyard.intake."


class _Named(msgspec.Struct):
    """Just the job id of a payload that is otherwise not a valid command."""

    job_id: str | None = None


_named = msgspec.json.Decoder(_Named)


def size_problem(size: int) -> str | None:
    if size > MAX_INTAKE_MESSAGE_BYTES:
        return (
            f"the message is {size} bytes; intake takes at most {MAX_INTAKE_MESSAGE_BYTES} "
            "(a job spec is at most 64 KiB as JSON)"
        )
    return None


def subject_tenant(subject: str) -> tuple[str, str | None]:
    """The tenant an intake subject names, and why it cannot be used (None: it can)."""
    tenant = subject[len(INTAKE_PREFIX) :] if subject.startswith(INTAKE_PREFIX) else ""
    if "." in tenant or not tenant:
        return tenant, f"{quoted(subject)} is not an intake subject: send to trainyard.intake.<tenant>"
    problem = name_problem(tenant)
    return tenant, None if problem is None else f"the subject's tenant: {problem}"


def job_id_of(data: bytes) -> tuple[str | None, str | None]:
    """The job id a payload that is not a valid command names, if it names a
    usable one: ``(job_id, None)``, or ``(None, why not)``."""
    try:
        job_id = _named.decode(data).job_id
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        job_id = None
    if not job_id:
        return None, "no job_id to reject it under"
    problem = job_id_problem(job_id)
    return (job_id, None) if problem is None else (None, f"job_id: {problem}")


def submit_errors(
    spec: JobSpec, job_id: str | None, subject: str, tenant: str, tenancy: Tenancy | None
) -> list[ValidationError]:
    """Every reason to reject a submission sent on ``subject`` (for ``tenant``),
    with the same rules as REST and gRPC, then against the tenancy."""
    errors = validate_submission(spec, job_id)
    if spec.tenant != tenant:
        errors.append(ValidationError("tenant", f"spec is for tenant {quoted(spec.tenant)} but was sent to {subject}"))
    if not errors and tenancy is not None:
        errors = validate_against_tenancy(spec, tenancy)
    return errors


def cancel_problem(tenant: str, job_id: str, body_tenant: str, reason: str) -> str | None:
    """Why a cancel sent for ``tenant`` cannot be carried out, before looking the job up."""
    problem = job_id_problem(job_id)
    if problem is not None:
        return f"job_id: {problem}"
    if body_tenant != tenant:
        return f"the cancel names tenant {quoted(body_tenant)} but was sent for tenant {tenant!r}"
    problem = text_problem(reason, MAX_REASON_CHARS, spaces=True)
    if problem is not None:
        return f"reason: {problem}"
    return None


def cancel_owner_problem(tenant: str, job_id: str, job_tenant: str) -> str | None:
    """A tenant may cancel only its own jobs."""
    if job_tenant != tenant:
        return f"job {job_id} does not belong to tenant {tenant}; a tenant may cancel only its own jobs"
    return None
