"""One paging contract for every list the gateway serves (REST and gRPC):
``limit`` and an opaque ``cursor`` in, ``next_cursor`` out (None at the end).

Cursors are made and read by :mod:`trainyard.paging`; a cursor that is
damaged, pages another list, or was given for other filters (another tenant
included: the caller's scope is applied to every page, never taken from the
cursor) is :class:`BadCursor`, a 400 (gRPC INVALID_ARGUMENT) whose message
says what to send instead."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import msgspec

from trainyard import paging
from trainyard.auth import Action, Principal, tenant_filter
from trainyard.domain.job import ValidationError
from trainyard.store.job_pages import JobQuery, Position
from trainyard_gateway.jobs import BadCursor, JobOperations, check_tenant_name, require_valid
from trainyard_gateway.metrics import JOB_STATUSES
from trainyard_gateway.schema import JobList

T = TypeVar("T")
Query = dict[str, paging.Scalar]


def position(cursor: str | None, list_name: str, query: Query, shape: tuple[type, ...]) -> list[paging.Scalar] | None:
    """The position ``cursor`` holds, one value of each type of ``shape`` (None:
    no cursor, the first page); :class:`BadCursor` when it is not a cursor of
    ``list_name`` given for ``query``."""
    if cursor is None or cursor == "":
        return None
    try:
        after = paging.decode(cursor, list_name, query, len(shape))
    except paging.InvalidCursor as err:
        raise BadCursor([ValidationError("cursor", str(err))]) from None
    if not all(_is(value, kind) for value, kind in zip(after, shape, strict=True)):
        raise BadCursor([ValidationError("cursor", f"the cursor is not one this API gave out: {paging.START_OVER}")])
    return after


def _is(value: paging.Scalar, kind: type) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int | float) if kind is float else isinstance(value, kind)


def next_cursor(list_name: str, query: Query, after: Sequence[paging.Scalar] | None) -> str | None:
    return None if after is None else paging.encode(list_name, query, list(after))


def page_of(
    items: Sequence[T], key: Callable[[T], str], list_name: str, query: Query, limit: int | None, cursor: str | None
) -> tuple[list[T], str | None]:
    """A page of a list the gateway holds whole (nodes, tokens), in order of
    ``key`` (unique): up to ``limit`` items (every one when None, as these
    lists answered before they paged) whose key follows the cursor's."""
    after = position(cursor, list_name, query, (str,))
    ordered = sorted(items, key=key)
    if after is not None:
        ordered = [item for item in ordered if key(item) > str(after[0])]
    page = ordered if limit is None else ordered[:limit]
    return page, next_cursor(list_name, query, [key(page[-1])] if len(ordered) > len(page) else None)


# --- jobs -------------------------------------------------------------------------------


def job_request(
    who: Principal,
    tenant: str | None,
    status: str | None,
    submitted_after: float | None,
    submitted_before: float | None,
    cursor: str | None,
) -> tuple[JobQuery, Position | None]:
    """A job list's filters, checked (the tenant narrowed to the caller's
    scope), and the position its cursor holds."""
    problems = check_tenant_name(tenant)
    if status is not None and status not in JOB_STATUSES:
        problems.append(ValidationError("status", f"{status!r} is not one of {', '.join(JOB_STATUSES)}"))
    if submitted_after is not None and submitted_before is not None and submitted_after >= submitted_before:
        problems.append(ValidationError("submitted_before", "must be later than submitted_after"))
    require_valid(problems)
    scope = tenant_filter(who, Action.JOB_LIST, tenant)
    query = JobQuery(tenant=scope, status=status, submitted_after=submitted_after, submitted_before=submitted_before)
    after = position(cursor, "jobs", msgspec.structs.asdict(query), (float, str))
    return query, None if after is None else (float(after[0]), str(after[1]))  # type: ignore[arg-type]


async def job_page(
    ops: JobOperations, query: JobQuery, limit: int, after: Position | None, archived: bool = False
) -> JobList:
    """A page of jobs; ``archived``: the job archive's too, after the projection's."""
    jobs, following = await ops.page(query, limit, after, archived)
    return JobList(jobs=jobs, next_cursor=next_cursor("jobs", msgspec.structs.asdict(query), following))
