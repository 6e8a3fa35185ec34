"""The chaos run's check of filtered lists against per-job reads.

After each rebuild of the projection (a FLUSHALL) and at the end of the run,
``GET /v1/jobs?status=<s>`` (for all tenants and for each tenant) must list
every job whose own read, ``GET /v1/jobs/<id>``, says ``s``, and no job whose
own read says another status.  The reads run while jobs still move, so:

- each job is read first; a job that its read puts in a status and that is
  missing from that status's list read afterwards is read again: if it still
  says that status, it is **unlisted** (a finished job never moves, so for
  the finished states this is exact);
- a job listed under a status other than the one its first read gave is read
  again: if it now says the list's status it moved in between, else it is
  **listed wrongly**.

A list holds at most ``limit`` jobs (the API's limit, newest first): a status
with that many or more is checked for what it lists, not for what it leaves
out (counted as **truncated**).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import httpx

from trainyard.local import LocalStack
from trainyard.testing.chaos_faults import FINISHED, read_back

LIST_LIMIT = 1000  # the API's most per list (trainyard_gateway.jobs.MAX_LIST_LIMIT)
ATTEMPTS = 600  # per request while the gateway answers 503 (rebuilding) or is away


async def _get(client: httpx.AsyncClient, path: str, params: dict[str, Any] | None = None) -> httpx.Response | None:
    """The answer once it is not a 503 (or the gateway restarting); None if that never came."""
    for _ in range(ATTEMPTS):
        try:
            response = await client.get(path, params=params)
        except httpx.HTTPError:
            response = None
        if response is not None and response.status_code < 500:
            return response
        await asyncio.sleep(0.1)
    return None


async def _statuses(client: httpx.AsyncClient, job_ids: Iterable[str]) -> dict[str, tuple[str, str]]:
    """Each job's (tenant, status) by its own read; jobs that cannot be read are left out."""
    sem = asyncio.Semaphore(32)
    out: dict[str, tuple[str, str]] = {}

    async def one(job_id: str) -> None:
        async with sem:
            response = await _get(client, f"/v1/jobs/{job_id}")
        if response is not None and response.status_code == 200:
            body = response.json()
            out[job_id] = (body["tenant"], body["status"])

    await asyncio.gather(*(one(j) for j in job_ids))
    return out


async def check_lists(
    client: httpx.AsyncClient, job_ids: Iterable[str], statuses: Sequence[str], limit: int = LIST_LIMIT
) -> Counter[str]:
    """Compare the lists of each of ``statuses`` with the own reads of ``job_ids``:
    counts of ``unlisted``, ``listed_wrongly``, ``truncated`` lists and ``compared`` jobs."""
    counts: Counter[str] = Counter()
    own = await _statuses(client, job_ids)
    counts["compared"] += len(own)
    scopes: list[str | None] = [None, *sorted({tenant for tenant, _ in own.values()})]
    for status in statuses:
        for tenant in scopes:
            params: dict[str, Any] = {"status": status, "limit": limit} | ({"tenant": tenant} if tenant else {})
            response = await _get(client, "/v1/jobs", params)
            if response is None or response.status_code != 200:
                counts["unanswered"] += 1
                continue
            listed = {j["job_id"] for j in response.json()["jobs"]}
            if len(listed) >= limit:
                counts["truncated"] += 1
            else:
                left_out = [
                    job_id
                    for job_id, (owner, said) in own.items()
                    if said == status and tenant in (None, owner) and job_id not in listed
                ]
                again = await _statuses(client, left_out)  # a job still moving may have left the status
                counts["unlisted"] += sum(1 for j in left_out if again.get(j, ("", ""))[1] == status)
            doubtful = [j for j in listed if j in own and own[j][1] != status]
            again = await _statuses(client, doubtful)
            counts["listed_wrongly"] += sum(1 for j in doubtful if again.get(j, ("", ""))[1] != status)
    return counts


def mismatches(counts: Counter[str] | dict[str, int]) -> int:
    return counts.get("unlisted", 0) + counts.get("listed_wrongly", 0)


STATUSES = ("pending", "admitted", "placed", "running", "succeeded", "failed", "cancelled", "rejected")


class _Run(Protocol):
    stack: LocalStack
    lists: Counter[str]  # the counts of check_lists, summed over the checks


async def check_run(run: _Run, job_ids: Iterable[str], statuses: Sequence[str] = STATUSES) -> None:
    """:func:`check_lists` through the run's gateway, added to ``run.lists``."""
    token = run.stack.admin_token
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(base_url=run.stack.api_url, timeout=10, headers=headers) as client:
        run.lists.update(await check_lists(client, job_ids, statuses))
    run.lists["checks"] += 1


async def after_rebuild(run: Any, finished: dict[str, str]) -> None:
    """Every job finished before a FLUSHALL read back while the projection is
    rebuilt (:func:`~trainyard.testing.chaos_faults.read_back`), then, rebuilt,
    the finished states' lists checked against those jobs' own reads."""
    await read_back(run, finished)
    await check_run(run, finished, FINISHED)
