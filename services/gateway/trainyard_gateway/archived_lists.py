"""Job lists that include archived jobs: the projection's page, then the job
archive's jobs merged in, in one order.

A finished job leaves the projection after its retention and is found in
the job archive (:mod:`trainyard.ledger.archive`) under the same place in
the lists: its score in the ``jobs`` index (the order it was accepted in)
and its id.  A page of a list that includes archived jobs is the page the
projection gives (:func:`trainyard.store.job_pages.page_jobs`) merged with
the archive's jobs after the same position, in the same direction, cut
where the projection's page stopped looking (a filtered walk of the
projection may stop before ``limit``), so the next page, which starts after
the last job given, neither skips nor repeats a job of either.  A job in
both (between its archiving and its removal) is given once, as the
projection holds it.
"""

from __future__ import annotations

import asyncio

from trainyard.core.lifecycle import JobRecord
from trainyard.ledger.archive import JobArchive
from trainyard.store.job_pages import JobPage, JobQuery, Position
from trainyard.store.store import Store

_CHUNK = 500  # archived jobs read per query while a time filter leaves some out


def _past(place: Position, bound: Position, newest_first: bool) -> bool:
    """Whether ``place`` comes after ``bound`` in the list's direction."""
    return place < bound if newest_first else place > bound


def _archived(
    archive: JobArchive, query: JobQuery, count: int, after: Position | None
) -> list[tuple[Position, JobRecord]]:
    """Up to ``count`` archived jobs of ``query`` after ``after``, with their places."""
    found: list[tuple[Position, JobRecord]] = []
    while len(found) < count:
        rows = archive.placed(query.tenant, query.status, max(count, _CHUNK), query.newest_first, after)
        found += [(place, job) for place, job in rows if query.matches(job)]
        if len(rows) < max(count, _CHUNK):
            break
        after = rows[-1][0]
    return found[:count]


async def with_archived(
    store: Store, archive: JobArchive, query: JobQuery, limit: int, after: Position | None, page: JobPage
) -> JobPage:
    """``page`` (the projection's page of ``query`` after ``after``) with the
    archived jobs that belong on it, and where the next page starts."""
    scores = await store.redis.zmscore(store.key("jobs"), [j.job_id for j in page.jobs]) if page.jobs else []
    rows = [
        ((float(score) if score is not None else float(job.order), job.job_id), job)
        for job, score in zip(page.jobs, scores, strict=True)
    ]
    held = {job.job_id for job in page.jobs}
    archived = await asyncio.to_thread(_archived, archive, query, limit + 1, after)
    if page.next is not None:  # the projection was not looked at past there
        archived = [row for row in archived if not _past(row[0], page.next, query.newest_first)]
    rows += [row for row in archived if row[1].job_id not in held]
    rows.sort(key=lambda row: row[0], reverse=query.newest_first)
    if len(rows) > limit:
        return JobPage([job for _, job in rows[:limit]], rows[limit - 1][0])
    return JobPage([job for _, job in rows], page.next)
