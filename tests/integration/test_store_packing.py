"""Commands packed by hiredis (``trainyard.store.packing``) are the bytes
redis-py would send, and a real Redis reads them back unchanged."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis
from redis.asyncio.connection import Connection, SSLConnection
from redis.exceptions import DataError

from trainyard.store import Store
from trainyard.store.packing import PackInC, pack_in_c

CASES = [
    pytest.param(("SET", "k", "v"), id="plain words"),
    pytest.param(("EVALSHA", "a" * 40, 1, "ty:", "12", "JobAccepted", "j-1"), id="a fold call with an int"),
    pytest.param(("SET", "k", "naïve ✓"), id="text that is not ASCII"),
    pytest.param(("SET", b"k", b"\r\n\x00\xff"), id="bytes with CR LF and NUL"),
    pytest.param(("SET", "k", 1.5), id="a float takes redis-py's own path"),
    pytest.param(("SCRIPT LOAD", "return 1"), id="a two-word command"),
    pytest.param(("SET", "k", 2**70), id="a big int"),
]


def packers() -> tuple[Connection, Connection]:
    fast = type("Connection", (PackInC, Connection), {})()
    return Connection(), fast


@pytest.mark.parametrize("args", CASES)
def test_the_bytes_are_those_redis_py_packs(args: tuple) -> None:
    plain, fast = packers()
    assert b"".join(fast.pack_command(*args)) == b"".join(plain.pack_command(*args))


def test_what_redis_py_refuses_is_refused_the_same_way() -> None:
    _, fast = packers()
    with pytest.raises(DataError):
        fast.pack_command("SET", "k", None)


def test_every_connection_class_of_a_client_gets_it_once() -> None:
    tls = pack_in_c(Redis(ssl=True))
    assert issubclass(tls.connection_pool.connection_class, SSLConnection)
    again = pack_in_c(tls).connection_pool.connection_class
    assert again is tls.connection_pool.connection_class


async def test_a_store_reads_back_what_it_wrote(store: Store) -> None:
    assert issubclass(store.redis.connection_pool.connection_class, PackInC)
    key = store.key("packing")
    await store.redis.hset(key, mapping={"text": "naïve ✓", "int": 2**40, "float": 0.1, "raw": b"a\r\nb"})
    assert await store.redis.hgetall(key) == {"text": "naïve ✓", "int": str(2**40), "float": "0.1", "raw": "a\r\nb"}
