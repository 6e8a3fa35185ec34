"""Lists of jobs, page by page: the reads behind ``GET /v1/jobs``, gRPC
``ListJobs`` and ``trainyard jobs``.

The fold keeps every job in sorted sets scored by its order (the JOBS stream
sequence of its ``JobAccepted`` or ``JobRejected``, so a newer job always
scores higher): ``jobs``, ``tenant:<t>``, ``bystatus:<s>`` and
``tbystatus:<t>:<s>``.  A page is read from the index that serves its
filters, after a :data:`Position` ``(score, job id)``: the next page starts
strictly after the last job looked at, so jobs accepted while a client walks
newest first (they score higher) never shift it, and nothing is returned twice
or skipped.  The job id breaks ties, although orders are unique.

Filters that no index serves (the submission time; a status whose index a
projection folded before the status indexes existed does not hold yet) are
checked on each job's hash while the index is walked; such a page looks at no
more than :data:`SCAN_BUDGET` jobs, so it may hold fewer than ``limit`` jobs
(even none) and still have a next page.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import msgspec

from trainyard.core.lifecycle import JobRecord
from trainyard.store.store import Store
from trainyard.store.views import get_jobs

#: Where a page ends: the index score (the job's order) and the job id of the last job looked at.
Position = tuple[float, str]

_SCAN_PAGE = 2048  # index entries read per step of a filtered walk
SCAN_BUDGET = 8 * _SCAN_PAGE  # index entries one filtered page looks at, at most
_CHECKED = ("status", "tenant", "submitted_at", "finished_at")  # what a filtered walk reads of each job


class JobQuery(msgspec.Struct, frozen=True, kw_only=True):
    """Which jobs a list holds, and in which order."""

    tenant: str | None = None
    status: str | None = None
    submitted_after: float | None = None  # Unix seconds, inclusive
    submitted_before: float | None = None  # Unix seconds, exclusive
    newest_first: bool = True

    def matches(self, job: JobRecord) -> bool:
        """Whether ``job`` belongs to this list (the submission time of a
        rejected job, which never had one, is when it was rejected)."""
        if (self.tenant and job.tenant != self.tenant) or (self.status and job.status != self.status):
            return False
        if self.submitted_after is None and self.submitted_before is None:
            return True
        at = job.submitted_at if job.submitted_at is not None else job.finished_at
        if at is None:
            return False
        return (self.submitted_after is None or at >= self.submitted_after) and (
            self.submitted_before is None or at < self.submitted_before
        )


class JobPage(NamedTuple):
    jobs: list[JobRecord]
    next: Position | None  # where the next page starts after; None: the list has ended


async def page_jobs(
    store: Store, query: JobQuery, limit: int, after: Position | None = None, fields: Iterable[str] | None = None
) -> JobPage:
    """Up to ``limit`` jobs of ``query`` after ``after`` (from the start when
    None): whole, or only ``fields`` of each (see :func:`~trainyard.store.views.get_jobs`)."""
    everything = store.key("tenant", query.tenant) if query.tenant else store.key("jobs")
    index = everything
    walk = query.submitted_after is not None or query.submitted_before is not None
    if query.status is not None:
        if await _status_indexed(store, query.status):
            index = (
                store.key("tbystatus", query.tenant, query.status)
                if query.tenant
                else store.key("bystatus", query.status)
            )
        else:
            walk = True
    if walk:
        return await _walk(store, index, query, limit, after, fields)
    rows = await _slice(store, index, after, limit + 1, query.newest_first)  # one more: is there a next page?
    rows, more = rows[:limit], len(rows) > limit
    jobs = await get_jobs(store, [job_id for job_id, _ in rows], fields)
    # an index moves in the same script as the hash, so this only guards
    # against a job read between two folds
    return JobPage([j for j in jobs if query.matches(j)], _position(rows[-1]) if more else None)


async def list_jobs(store: Store, query: JobQuery, limit: int) -> list[JobRecord]:
    """The first ``limit`` jobs of ``query``, however many pages that takes."""
    jobs: list[JobRecord] = []
    after: Position | None = None
    while len(jobs) < limit:
        page = await page_jobs(store, query, limit - len(jobs), after)
        jobs += page.jobs
        if page.next is None:
            break
        after = page.next
    return jobs


async def _walk(
    store: Store, index: str, query: JobQuery, limit: int, after: Position | None, fields: Iterable[str] | None
) -> JobPage:
    """The jobs of ``index`` after ``after`` that match ``query``, checked on
    their hashes, until ``limit`` match, :data:`SCAN_BUDGET` are looked at or the index ends."""
    found: list[str] = []
    looked = 0
    while looked < SCAN_BUDGET:
        rows = await _slice(store, index, after, _SCAN_PAGE, query.newest_first)
        checked = {j.job_id: j for j in await get_jobs(store, [job_id for job_id, _ in rows], _CHECKED)}
        for row in rows:
            looked += 1
            after = _position(row)
            job = checked.get(row[0])
            if job is not None and query.matches(job):
                found.append(job.job_id)
                if len(found) == limit:
                    break
        ended = len(rows) < _SCAN_PAGE and (not rows or after == _position(rows[-1]))  # read to the index's end
        if ended or len(found) == limit:
            return JobPage(await _matching(store, query, found, fields), None if ended else after)
    return JobPage(await _matching(store, query, found, fields), after)


async def _matching(store: Store, query: JobQuery, job_ids: list[str], fields: Iterable[str] | None) -> list[JobRecord]:
    """The records of ``job_ids`` that still match ``query`` (a job may have moved on since it was checked)."""
    read = None if fields is None else {*fields, *_CHECKED}
    return [j for j in await get_jobs(store, job_ids, read) if query.matches(j)]


def _position(row: tuple[str, float]) -> Position:
    return (float(row[1]), row[0])


async def _slice(
    store: Store, index: str, after: Position | None, count: int, newest_first: bool
) -> list[tuple[str, float]]:
    """Up to ``count`` ``(job id, score)`` of ``index`` strictly after ``after``,
    highest score first (or lowest); ties in score by job id, as Redis orders them."""
    pipe = store.redis.pipeline(transaction=False)
    by_score = pipe.zrevrangebyscore if newest_first else pipe.zrangebyscore  # (index, first, last)
    first, last = ("+inf", "-inf") if newest_first else ("-inf", "+inf")
    if after is None:
        by_score(index, first, last, start=0, num=count, withscores=True)
        (rows,) = await pipe.execute()
    else:
        score, job_id = after
        by_score(index, score, score, withscores=True)  # the jobs tied with the last one, if any
        by_score(index, f"({score!r}", last, start=0, num=count, withscores=True)
        tied, rest = await pipe.execute()
        rows = [row for row in tied if (row[0] < job_id if newest_first else row[0] > job_id)] + rest
    return [(str(job), float(at)) for job, at in rows[:count]]


async def _status_indexed(store: Store, status: str) -> bool:
    """Whether the index of ``status`` holds every job of that status: not so
    in a projection folded before the status indexes existed (until it is
    rebuilt), whose lists then check each job's status instead."""
    pipe = store.redis.pipeline(transaction=True)  # both in one moment: the fold moves them together
    pipe.hget(store.key("counts"), status)
    pipe.zcard(store.key("bystatus", status))
    counted, indexed = await pipe.execute()
    return int(counted or 0) == int(indexed)
