"""Values read from a projection, kept until the projection moves.

A projection's ``(epoch, last applied sequence)`` names its content: every
fold bumps the sequence, and a wipe or rebuild starts a new epoch, so while
both are unchanged nothing in the projection changed and a value read from it
still holds.  One small read (``projection_state``) then replaces the whole
read.  The state is read before the value: a value may be newer than the
state it is kept under (it is then read again next time), never older.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from trainyard.store.store import Store

T = TypeVar("T")


class ProjectionCache(Generic[T]):
    """``read(store)``, done again only when the projection moved since the last read."""

    def __init__(self, store: Store, projection: str, read: Callable[[Store], Awaitable[T]], empty: T) -> None:
        self.store = store
        self.projection = projection  # "nodes" or "jobs"
        self.read = read
        self.reads = 0  # times the value was read from Redis (not kept)
        self._at: tuple[str, int] | None = None  # projection (epoch, last applied) the value is of
        self._value = empty

    async def get(self) -> T:
        state = await self.store.projection_state(self.projection)
        if state != self._at:
            self._value = await self.read(self.store)
            self._at = state
            self.reads += 1
        return self._value
