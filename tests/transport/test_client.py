"""The transport's connections pack commands with hiredis (pipeline/transport/client.py)."""

import pytest
from redis.asyncio.connection import Connection
from redis.exceptions import DataError

from pipeline.transport.client import _packed, connect

PACKED = _packed(Connection)


@pytest.mark.parametrize("args", [
    ("SET", "k", "é"),
    ("SET", b"k", 1.5),
    ("SET", "k", 0.1),
    ("SET", "k", -3),
    ("SET", "k", 2**70),
    ("SET", "k", memoryview(b"ab")),
    ("SCRIPT LOAD", "return 1"),
    (b"CONFIG GET", "maxmemory"),
    ("EVALSHA", "a" * 40, 3, "k1", "k2", "k3", "tok", 2) + ("1700000000.25", 3, b"u1", b"x" * 7000, 0) * 2,
])
def test_the_same_bytes_as_redis_py(args):
    assert b"".join(PACKED().pack_command(*args)) == b"".join(bytes(c) for c in Connection().pack_command(*args))


def test_what_hiredis_refuses_is_redis_pys_error():
    with pytest.raises(DataError):
        PACKED().pack_command("SET", "k", None)


async def test_a_transport_client_packs_with_hiredis_and_works(redis_url):
    client = await connect([redis_url])
    try:
        assert issubclass(client.connection_pool.connection_class, PACKED.__mro__[1])
        assert client.connection_pool.connection_class.__name__.startswith("Packed")
        await client.set("packed:k", "é" * 10_000)
        assert (await client.get("packed:k")).decode() == "é" * 10_000
        assert await client.execute_command("SCRIPT LOAD", "return 1")
    finally:
        await client.aclose()


async def test_retry_transient_waits_out_a_broker_blip_and_passes_other_errors():
    from redis.exceptions import BusyLoadingError, ConnectionError as RedisConnectionError

    from pipeline.transport.producer import retry_transient

    calls = []

    async def flaky():
        calls.append(1)
        if len(calls) == 1:
            raise RedisConnectionError("Connection closed by server.")
        if len(calls) == 2:
            raise BusyLoadingError("loading the dataset in memory")
        return 8

    assert await retry_transient(flaky, "partitions of t", first_delay=0.001) == 8
    assert len(calls) == 3

    async def broken():
        raise ValueError("not a broker blip")

    with pytest.raises(ValueError):
        await retry_transient(broken, "x", first_delay=0.001)
