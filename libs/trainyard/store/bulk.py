"""The same fields of many hashes, read in chunks of one script call each over one connection.

A cold admission cycle reads 100,000 job hashes.  One ``HMGET`` per hash
would have the client pack and parse 100,000 commands, so each chunk of
hashes is one script call (the ``HMGET``s run in the server).  The server
and the client then take turns: the server runs a chunk's script while the
client decodes the chunk before it.  For that the next call must be on the
wire before the client starts decoding, which a task started with
``ensure_future`` is not (it runs only once the decoding yields).  So the
calls go out on one connection taken from the client's pool, always one
chunk ahead of the replies read; Redis answers a connection's commands in
order.

A connection whose replies were not all read (a chunk that failed to
decode, a cancelled read, a broken connection) is closed before it goes
back to the pool, so no later command reads a reply that was not its own;
a broken connection is replaced and the read starts over, with the same
retries as the client's own commands.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from trainyard.store.store import Store

T = TypeVar("T")

#: Reads the same fields (ARGV) of many hashes (KEYS) in one call: one reply
#: per hash, its values in the order of ARGV (nil where a field is absent).
HMGET_MANY = """
local out = {}
for i, key in ipairs(KEYS) do
  out[i] = redis.call('HMGET', key, unpack(ARGV))
end
return out
"""


async def read_chunks(
    store: Store, chunks: Sequence[Sequence[str]], fields: Sequence[str], decode: Callable[[int, list[Any]], T]
) -> list[T]:
    """``decode(k, rows)`` of each chunk ``k`` of keys, in order: ``rows`` holds each
    key's values of ``fields``.  The next chunk's call is in the server while
    ``decode`` runs.  A lost connection starts the read over on a new one, as the
    client's own commands retry (its ``retry`` setting); any other exception, from
    Redis or from ``decode``, ends the read."""
    if not chunks:
        return []
    pool = store.redis.connection_pool
    conn = await pool.get_connection()

    async def read() -> list[T]:
        done = False
        try:

            async def send(k: int) -> None:
                await conn.send_command("EVAL", HMGET_MANY, len(chunks[k]), *chunks[k], *fields)

            await send(0)
            out = []
            for k in range(len(chunks)):
                if k + 1 < len(chunks):
                    await send(k + 1)
                rows = await conn.read_response()
                out.append(decode(k, rows))
            done = True
            return out
        finally:
            if not done:
                await conn.disconnect()  # replies still on their way: nobody else may read them

    try:
        return await conn.retry.call_with_retry(read, lambda error: conn.disconnect())
    finally:
        await pool.release(conn)
