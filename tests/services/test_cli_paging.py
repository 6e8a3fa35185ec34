"""``trainyard jobs`` pages as a user runs it, against a gateway on real NATS
and Redis: it shows the newest jobs and says how to see more, ``--limit N``
and ``--all`` read page after page (``-o json`` prints every job as one list),
``--cursor`` goes on where a list stopped, and the filters are sent along."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from cli_fixtures import served, trainyard

from trainyard.bus import Bus
from trainyard.store import Store, views
from trainyard.testing import job_seeding as seeding
from trainyard.testing.auth import Callers
from trainyard.testing.waiting import eventually

SEEDED = 5  # the jobs cli_fixtures seeds
MORE = 2_100  # more than two of the CLI's pages of 1,000


@pytest.fixture
async def gateway(bus: Bus, store: Store, callers: Callers, tmp_path: Path) -> AsyncIterator[str]:
    async with served(bus, store, callers, tmp_path) as url:
        await seeding.publish_jobs(bus, 0, MORE)

        async def folded() -> bool:
            return len(await views.list_jobs(store, limit=MORE + SEEDED)) == MORE + SEEDED

        await eventually(folded, timeout=120, what="every job is folded")
        yield url


async def test_jobs_shows_the_newest_50_and_says_how_to_see_more(
    gateway: str, callers: Callers, tmp_path: Path
) -> None:
    base = ["--token", callers.tokens["admin"], "jobs", "--api-url", gateway]

    first = await trainyard(*base, "--no-headers", home=tmp_path)
    cursor = re.search(r"--cursor (\S+)", first.stderr)
    assert cursor is not None, first.stderr
    following = await trainyard(*base, "-o", "name", "--limit", "3", "--cursor", cursor.group(1), home=tmp_path)

    assert first.returncode == 0, first.stderr
    assert [line.split()[0] for line in first.stdout.splitlines()] == [
        seeding.job_id(i) for i in reversed(range(MORE - 50, MORE))
    ]
    assert "50 shown; more: `trainyard jobs --limit N` or `--all`" in first.stderr
    assert following.stdout.split() == [seeding.job_id(i) for i in reversed(range(MORE - 53, MORE - 50))]


async def test_all_as_json_prints_every_job_once_from_every_page(
    gateway: str, callers: Callers, tmp_path: Path
) -> None:
    listed = await trainyard(
        "--token", callers.tokens["admin"], "jobs", "--all", "-o", "json", "--api-url", gateway, home=tmp_path
    )

    jobs = [j["job_id"] for j in json.loads(listed.stdout)]
    assert len(jobs) == len(set(jobs)) == MORE + SEEDED
    assert jobs[:MORE] == [seeding.job_id(i) for i in reversed(range(MORE))]
    assert "shown; more" not in listed.stderr  # nothing is left


async def test_limit_walks_pages_and_the_filters_are_sent(gateway: str, callers: Callers, tmp_path: Path) -> None:
    base = ["--token", callers.tokens["admin"], "jobs", "-o", "name", "--api-url", gateway]

    many = await trainyard(*base, "--limit", "1500", home=tmp_path)
    globex = await trainyard(*base, "--all", "--tenant", "globex", "--status", "cancelled", home=tmp_path)
    window = await trainyard(
        *base,
        "--all",
        "--submitted-after",
        str(seeding.SUBMITTED_AT + 10),
        "--submitted-before",
        str(seeding.SUBMITTED_AT + 20),
        home=tmp_path,
    )
    zero = await trainyard(*base, "--limit", "0", home=tmp_path)

    assert many.stdout.split() == [seeding.job_id(i) for i in reversed(range(MORE - 1500, MORE))]
    assert globex.stdout.split() == [seeding.job_id(i) for i in reversed(range(MORE)) if i % 2 == 1 and i % 3 == 0]
    assert window.stdout.split() == [seeding.job_id(i) for i in reversed(range(10, 20))]
    assert zero.returncode == 2 and "--limit" in zero.stderr and "give 1 or more" in zero.stderr
