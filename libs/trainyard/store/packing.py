"""Redis commands packed in C.

redis-py's asyncio connection packs every command in Python, argument by
argument (its synchronous client already uses hiredis for this).  The folds
send an EVALSHA with a dozen or more arguments per event, so packing was a
sixth of the placement service's time in ``bench/pipeline.py``.
:func:`pack_in_c` makes a client's connections pack with ``hiredis.pack_command``
(about 9x faster for such a command); the bytes on the wire are the same.
Arguments other than ``str``, ``bytes`` and ``int`` (floats, whose text
redis-py takes from ``repr``; memoryviews; anything it refuses) take
redis-py's own path.
"""

from __future__ import annotations

from typing import Any

import hiredis
from redis.asyncio import Redis


class PackInC:
    """Mixin over a ``redis.asyncio`` connection class."""

    def pack_command(self, *args: Any) -> list[bytes]:
        first = args[0]
        if isinstance(first, str):  # "SCRIPT LOAD" is two words: as redis-py splits it
            args = (*first.encode().split(), *args[1:])
        elif b" " in first:
            args = (*first.split(), *args[1:])
        for arg in args:
            kind = type(arg)
            if kind is not str and kind is not bytes and kind is not int:
                return super().pack_command(*args)  # type: ignore[misc,no-any-return]
        return [hiredis.pack_command(args)]


def pack_in_c(client: Redis) -> Redis:
    """``client``, whose connections (made from now on) pack commands with hiredis."""
    pool = client.connection_pool
    base = pool.connection_class
    if not issubclass(base, PackInC):
        pool.connection_class = type(base.__name__, (PackInC, base), {})
    return client
