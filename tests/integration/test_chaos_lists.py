"""The chaos run's filtered-list check, against a real gateway on real NATS and
Redis: lists that agree with the jobs' own reads count no mismatch; a job its
own read puts in a status that the status's list leaves out is counted; a
list at the API's limit is checked for what it lists only; the chaos report
is not clean with a mismatch."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import msgspec
import pytest
from test_projection import lifecycle

from trainyard.bus import Bus
from trainyard.events import RunSucceeded
from trainyard.store import Store
from trainyard.testing.auth import Callers
from trainyard.testing.chaos import ChaosReport
from trainyard.testing.chaos_lists import STATUSES, check_lists, mismatches
from trainyard.testing.publish import publish_event
from trainyard.testing.streams import project
from trainyard_gateway.jobs import JobOperations
from trainyard_gateway.rest import create_app

JOB_IDS = [f"j{i}" for i in range(6)]


@pytest.fixture
async def gateway(bus: Bus, store: Store, callers: Callers) -> AsyncIterator[httpx.AsyncClient]:
    """Six jobs of tenant acme, projected: j0, j2, j4 succeeded, the rest running."""
    for i, job_id in enumerate(JOB_IDS):
        await lifecycle(bus, job_id, f"{job_id}-r1", "n1", [i])
        if i % 2 == 0:
            done = RunSucceeded(at=9.0, job_id=job_id, tenant="acme", run_id=f"{job_id}-r1")
            await publish_event(bus, done, msg_id=f"{job_id}:done")
    await project(bus, store, "JOBS")
    app = create_app(JobOperations(bus, store), store, callers.authenticator)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://gateway", headers=callers.headers("admin")
    ) as client:
        yield client


async def test_lists_that_agree_with_the_jobs_own_reads_count_no_mismatch(gateway: httpx.AsyncClient) -> None:
    counts = await check_lists(gateway, JOB_IDS, STATUSES)

    assert counts["compared"] == len(JOB_IDS)
    assert mismatches(counts) == 0 and counts["truncated"] == 0 and counts["unanswered"] == 0, counts


async def test_a_job_its_own_read_says_succeeded_that_the_tenants_list_leaves_out_is_unlisted(
    gateway: httpx.AsyncClient, store: Store
) -> None:
    await store.redis.zrem(store.key("tbystatus", "acme", "succeeded"), "j2")  # the tenant's index loses one job

    counts = await check_lists(gateway, JOB_IDS, ("succeeded", "running"))

    assert counts["unlisted"] == 1 and counts["listed_wrongly"] == 0, counts
    assert mismatches(counts) == 1
    report = msgspec.convert(
        {
            **{f: 0 for f in ("seed", "jobs", "lost", "accepted_twice", "run_twice", "stuck", "dead_letters")},
            **{f: 0 for f in ("double_allocations", "ledger_minus_stream_gpu_s", "offered_s", "drained_s")},
            **{f: {} for f in ("faults", "dead_letter_reasons", "statuses", "unplanned_exits", "failed_runs")},
            "violations": [],
        },
        ChaosReport,
    )
    assert report.clean
    assert not msgspec.structs.replace(report, lists=dict(counts)).clean


async def test_a_list_at_the_limit_is_checked_for_what_it_lists_not_for_what_it_leaves_out(
    gateway: httpx.AsyncClient,
) -> None:
    counts = await check_lists(gateway, JOB_IDS, ("succeeded",), limit=2)  # three succeeded, two listed

    assert counts["truncated"] == 2 and mismatches(counts) == 0, counts  # all tenants, and acme
