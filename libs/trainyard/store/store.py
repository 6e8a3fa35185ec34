"""The Redis side of one Trainyard installation: a client, the key prefix, and the fold scripts."""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from typing import Any

from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

from trainyard.store.packing import pack_in_c


def _lua(name: str) -> str:
    return resources.files("trainyard.store").joinpath("lua", name).read_text()


# Adopt the projection's epoch, or start a new one where Redis has none (a
# build from sequence 0): KEYS[1] = the proj:<name> hash, ARGV[1] = a new epoch.
_JOIN = """
local epoch = redis.call('HGET', KEYS[1], 'epoch')
if not epoch then
  epoch = ARGV[1]
  redis.call('HSET', KEYS[1], 'epoch', epoch)
end
return {epoch, redis.call('HGET', KEYS[1], 'last_seq') or '0'}
"""


class Store:
    """A Redis client plus the key prefix of one Trainyard installation."""

    def __init__(self, redis: Redis, prefix: str = "ty:") -> None:
        self.redis = pack_in_c(redis)
        self.prefix = prefix
        self._apply_job = redis.register_script(_lua("apply_job_event.lua"))
        self._apply_node = redis.register_script(_lua("apply_node_event.lua"))
        self._join = redis.register_script(_JOIN)

    async def run_script(
        self, script: AsyncScript, calls: list[Sequence[str | bytes]], keys: Sequence[str] | None = None
    ) -> list[Any]:
        """``script`` per argument list in ``calls`` (``keys``, default the prefix) as one pipeline of EVALSHA,
        without redis-py's SCRIPT EXISTS round trip; a Redis that lost the script loads it and runs the calls
        again, so every script run this way must be idempotent (the folds are fenced by sequence)."""
        keys = [self.prefix] if keys is None else list(keys)
        for attempt in range(2):
            pipe = self.redis.pipeline(transaction=False)
            for args in calls:
                pipe.evalsha(script.sha, len(keys), *keys, *args)
            try:
                return await pipe.execute()
            except NoScriptError:
                if attempt:
                    raise
                script.sha = await self.redis.script_load(script.script)
        raise AssertionError("unreachable")

    @classmethod
    def from_url(cls, url: str, prefix: str = "ty:", **options: Any) -> Store:
        """``options`` go to the client: ``username`` and ``password`` for an
        ACL user, ``ssl_*`` for TLS (see ``trainyard.runtime.redis_options``)."""
        return cls(Redis.from_url(url, decode_responses=True, **options), prefix)

    def key(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    async def close(self) -> None:
        await self.redis.aclose()

    async def last_seq(self, projection: str) -> int:
        value = await self.redis.hget(self.key("proj", projection), "last_seq")
        return int(value or 0)

    async def projection_state(self, projection: str) -> tuple[str, int]:
        """The projection's epoch ("" when Redis has none) and last applied sequence."""
        epoch, last = await self.redis.hmget(self.key("proj", projection), ["epoch", "last_seq"])
        return epoch or "", int(last or 0)

    async def flush(self) -> None:
        """Drop every key of this installation (for ``trainyard admin rebuild``)."""
        async for key in self.redis.scan_iter(match=self.prefix + "*", count=1000):
            await self.redis.delete(key)
