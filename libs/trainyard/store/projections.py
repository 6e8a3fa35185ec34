"""The reads of the projections that service logic makes through an interface,
so that the logic can be tested on the in-memory fake
(``trainyard.testing.fakes.FakeProjections``), which a contract test holds to
what Redis answers.

Admission's intake reads through it: the job that holds a job id, and the
registered fleet for the never-fit check.  Most readers still call
``trainyard.store.views`` on Redis directly.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from trainyard.bus import Bus
from trainyard.core.admission.fit import FleetSummary
from trainyard.core.lifecycle import JobRecord
from trainyard.ledger.archive import JobArchive
from trainyard.store import views
from trainyard.store.fleet import FleetCache
from trainyard.store.store import Store


class Projections(Protocol):
    async def job(self, job_id: str) -> JobRecord | None:
        """The job with this id, as the JOBS projection holds it now; None when it holds none."""

    async def fleet(self) -> FleetSummary:
        """Every node ever registered, as the NODES projection holds it now."""

    async def caught_up_fleet(self) -> FleetSummary:
        """The fleet once the NODES projection holds every event published so
        far; :class:`~trainyard.bus.NotCaughtUp` while it does not."""


class RedisProjections:
    """:class:`Projections` read from Redis; a job the projection no longer
    holds (finished, past its retention) is read from ``archive`` when given."""

    def __init__(self, bus: Bus, store: Store, archive: JobArchive | None = None) -> None:
        self.store = store
        self.archive = archive
        self._fleet = FleetCache(bus, store)

    async def job(self, job_id: str) -> JobRecord | None:
        job = await views.get_job(self.store, job_id)
        if job is None and self.archive is not None:
            job = await asyncio.to_thread(self.archive.get, job_id)
        return job

    async def fleet(self) -> FleetSummary:
        return await self._fleet.summary()

    async def caught_up_fleet(self) -> FleetSummary:
        return await self._fleet.caught_up_summary()
