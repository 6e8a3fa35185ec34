"""The registered fleet, summarised for admission's never-fit check.

Read from the NODES projection (the ``nodeinfo`` hash: every node ever
registered, whatever its state) and kept until the projection moves, so a
batch of submissions costs one small Redis read while no node changes.
"""

from __future__ import annotations

import functools

import msgspec

from trainyard.bus import Bus
from trainyard.bus.subscription import NotCaughtUp
from trainyard.core.admission.fit import FleetSummary
from trainyard.domain.node import NodeInfo
from trainyard.store.cache import ProjectionCache
from trainyard.store.projector import wait_until_projected
from trainyard.store.store import Store

_node = msgspec.json.Decoder(NodeInfo)


@functools.lru_cache(maxsize=65_536)
def _shape(raw: str) -> tuple[str, int] | None:
    """``(gpu_type, gpus)`` of one projected node; None for one that does not decode."""
    try:
        info = _node.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return info.gpu_type, info.gpus


async def read_fleet(store: Store) -> FleetSummary:
    """The fleet as the NODES projection holds it now."""
    infos = await store.redis.hgetall(store.key("nodeinfo"))
    return FleetSummary.of(shape for shape in map(_shape, infos.values()) if shape is not None)


class FleetCache:
    """The fleet summary, read again only when the NODES projection moved."""

    def __init__(self, bus: Bus, store: Store, catch_up_timeout_s: float = 5.0) -> None:
        self.bus = bus
        self.store = store
        self.catch_up_timeout_s = catch_up_timeout_s
        self._cache = ProjectionCache(store, "nodes", read_fleet, FleetSummary())

    async def summary(self) -> FleetSummary:
        return await self._cache.get()

    async def caught_up_summary(self) -> FleetSummary:
        """The summary once the projection holds every NODES event published so
        far: before a job is refused, a node registered a moment ago counts.
        Raises :class:`NotCaughtUp` while the projection is being rebuilt."""
        try:
            await wait_until_projected(self.bus, self.store, "NODES", timeout=self.catch_up_timeout_s)
        except TimeoutError as err:
            raise NotCaughtUp(f"the fleet is not known yet: {err}") from err
        return await self.summary()
