"""Leader leases in a NATS KV bucket, fenced by the key's revision.

One process per scheduling domain makes decisions; standbys wait for the key to
expire (the bucket's TTL) and then take it.  A leader that fails to renew in
time stops deciding before anyone else can take over.
"""

from __future__ import annotations

import asyncio
import time

from nats.js.errors import BadRequestError, KeyWrongLastSequenceError, NotFoundError
from nats.js.kv import KeyValue

from trainyard.bus.connection import Bus

BUCKET = "trainyard-leases"


class Lease:
    def __init__(self, kv: KeyValue, key: str, holder: str, ttl_s: float) -> None:
        self.kv = kv
        self.key = key
        self.holder = holder
        self.ttl_s = ttl_s
        self.revision: int | None = None  # the fencing token while we lead
        self._valid_until = 0.0

    @classmethod
    async def open(cls, bus: Bus, key: str, holder: str, ttl_s: float = 3.0, replicas: int = 1) -> Lease:
        """The lease ``key``; creates the bucket (with ``replicas``) if it is missing."""
        try:
            kv = await bus.js.key_value(BUCKET)
        except (NotFoundError, BadRequestError):
            kv = await bus.js.create_key_value(bucket=BUCKET, ttl=ttl_s, history=1, replicas=replicas)
        return cls(kv, key, holder, ttl_s)

    @property
    def held(self) -> bool:
        """True while we hold the lease with a safety margin before it expires."""
        return self.revision is not None and time.monotonic() < self._valid_until

    async def try_acquire(self) -> bool:
        started = time.monotonic()
        try:
            if self.revision is None:
                self.revision = await self.kv.create(self.key, self.holder.encode())
            else:
                self.revision = await self.kv.update(self.key, self.holder.encode(), last=self.revision)
        except (KeyWrongLastSequenceError, BadRequestError):
            self.revision = None
            return False
        self._valid_until = started + self.ttl_s * 0.6
        return True

    async def keep(self, stop: asyncio.Event, after: asyncio.Event | None = None) -> None:
        """Acquire and renew until ``stop``; callers check :attr:`held`.

        With ``after``, the lease is not contended for until that event is set:
        a process that must read its state before it can decide (admission's
        backlog) reads it first, so it never holds the lease, keeping a ready
        standby out, while it cannot decide yet."""
        if after is not None and not after.is_set():
            ready, stopped = asyncio.ensure_future(after.wait()), asyncio.ensure_future(stop.wait())
            try:
                await asyncio.wait([ready, stopped], return_when=asyncio.FIRST_COMPLETED)
            finally:
                ready.cancel()
                stopped.cancel()
        while not stop.is_set():
            try:
                await self.try_acquire()
            except Exception:  # noqa: BLE001 - NATS unavailable: we are not leader
                self.revision = None
            try:
                await asyncio.wait_for(stop.wait(), self.ttl_s / 4)
            except TimeoutError:
                pass

    async def release(self) -> None:
        if self.revision is not None:
            try:
                await self.kv.delete(self.key, last=self.revision)
            except Exception:  # noqa: BLE001 - it will expire anyway
                pass
            self.revision = None
