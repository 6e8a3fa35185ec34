"""The one reader of health's node records (``health:rec``: node id ->
``NodeHealthRecord`` as JSON, with its bounded history).

The health service writes them (``trainyard_health.records.RecordStore``,
version-checked); health itself and the gateway (``GET /v1/nodes/{id}/history``,
node commands checked against the record) read them through :class:`NodeRecords`.
The records are not on the log: a wiped Redis loses them, and health starts
each node again from the NODES projection's state.
"""

from __future__ import annotations

import msgspec

from trainyard.core.health import NodeHealthRecord
from trainyard.store.store import Store

_record = msgspec.json.Decoder(NodeHealthRecord)


class NodeRecords:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.key = store.key("health", "rec")

    @staticmethod
    def decode(raw: str | bytes) -> NodeHealthRecord:
        """One record as stored (for a caller that read it in its own pipeline from :attr:`key`)."""
        return _record.decode(raw)

    async def get(self, node_id: str) -> NodeHealthRecord | None:
        """The node's record; None where health has not judged the node yet."""
        raw = await self.store.redis.hget(self.key, node_id)
        return _record.decode(raw) if raw else None

    async def all(self) -> dict[str, NodeHealthRecord]:
        """Every node's record, by node id."""
        raw = await self.store.redis.hgetall(self.key)
        return {node_id: _record.decode(data) for node_id, data in raw.items()}
