"""The producer's own connection (pipeline/transport/wire.py): the same results as
redis-py's pipeline on a real server, and a lost, hung or garbled connection is a
``ConnectionError`` or ``TimeoutError`` (what the producer retries), never a hang
or a reply handed to the wrong call."""

import asyncio
import contextlib
import socket

import pytest
import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from pipeline.transport.client import TRANSIENT_ERRORS, connect
from pipeline.transport.keys import Keys
from pipeline.transport.produce import ProduceBatch, load_produce
from pipeline.transport.wire import Wire, run_commands

KEYS = Keys()
ENTRIES = [("1.5", b"u1", b"v1", []), ("1.5", None, b"v2", [("h", b"x")]), ("1.5", b"u3", None, [])]


@contextlib.asynccontextmanager
async def _client_and_wire(url):
    """A transport client of ``url`` and the wire to its server, both closed after."""
    client = await connect([url])
    wire = Wire.for_client(client)
    try:
        yield client, wire
    finally:
        await wire.aclose()
        await client.aclose()


async def _batch_results(client, wire):
    batch = ProduceBatch(client, KEYS, wire)
    batch.add("w.t", 0, "", ENTRIES)
    batch.add("w.t", 1, "", ENTRIES[:1])
    batch.add("w.fenced", 0, "token-of-nobody", ENTRIES[:1])
    return await batch.run()


async def test_the_same_results_and_entries_as_redis_pys_pipeline(redis_url, redis_sync):
    async with _client_and_wire(redis_url) as (client, wire):
        assert wire is not None
        await load_produce(client)
        via_redis_py = await _batch_results(client, None)
        streams_py = {k: redis_sync.xrange(k) for k in (KEYS.stream("w.t", 0), KEYS.stream("w.t", 1))}
        redis_sync.flushall()
        await load_produce(client)
        via_wire = await _batch_results(client, wire)
        streams_wire = {k: redis_sync.xrange(k) for k in (KEYS.stream("w.t", 0), KEYS.stream("w.t", 1))}
        assert via_wire[:2] == via_redis_py[:2] == [0, 0]
        # an error reply is the same exception class with the same text, returned, not raised
        assert type(via_wire[2]) is type(via_redis_py[2]) and str(via_wire[2]) == str(via_redis_py[2])
        assert isinstance(via_wire[2], ResponseError) and str(via_wire[2]).startswith("FENCED")
        strip = lambda s: {k: [(i, {f: v for f, v in fields.items() if f != b"t"}) for i, fields in e]
                           for k, e in s.items()}
        assert strip(streams_wire) == strip(streams_py)


async def test_noscript_is_redis_pys_class_and_the_batch_loads_the_script(redis_url, redis_sync):
    async with _client_and_wire(redis_url) as (client, wire):
        redis_sync.script_flush()
        replies = await wire.execute([("EVALSHA", "0" * 40, 0)])
        assert isinstance(replies[0], NoScriptError)
        # ProduceBatch.run loads the script on NOSCRIPT and sends those calls again
        assert (await _batch_results(client, wire))[:2] == [0, 0]


async def test_calls_in_flight_together_each_get_their_own_replies(redis_url):
    async with _client_and_wire(redis_url) as (client, wire):
        await wire.execute([("PING",)])
        sock = wire._proto.transport.get_extra_info("socket")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE)
        calls = [wire.execute([("SET", f"w:{i}", i), ("GET", f"w:{i}"), ("INCR", "w:n")]) for i in range(50)]
        results = await asyncio.gather(*calls)
        assert [r[1] for r in results] == [str(i).encode() for i in range(50)]
        assert sorted(r[2] for r in results) == list(range(1, 51))


async def test_auth_and_db_of_the_url(fresh_server):
    admin = redis.Redis.from_url(fresh_server.url)
    admin.config_set("requirepass", "s3cret")
    try:
        url = fresh_server.url.replace("redis://", "redis://:s3cret@").rsplit("/", 1)[0] + "/3"
        async with _client_and_wire(url) as (client, wire):
            assert (wire.db, wire.password) == (3, "s3cret")
            await wire.execute([("SET", "w:db", "x")])
            assert await client.get("w:db") == b"x"  # db 3, as the client's
            bad = Wire(wire.host, wire.port, password="wrong")
            with pytest.raises(redis.exceptions.AuthenticationError):
                await bad.execute([("PING",)])
    finally:
        redis.Redis.from_url(fresh_server.url, password="s3cret").config_set("requirepass", "")
        admin.close()


async def test_a_killed_connection_fails_the_call_in_flight_then_the_next_call_reconnects(fresh_server):
    admin = redis.Redis.from_url(fresh_server.url)
    try:
        async with _client_and_wire(fresh_server.url) as (client, wire):
            assert await wire.execute([("PING",)]) == [b"PONG"]
            in_flight = asyncio.ensure_future(wire.execute([("BLPOP", "w:nothing", 5)]))
            await asyncio.sleep(0.1)
            admin.execute_command("CLIENT", "KILL", "TYPE", "normal")
            with pytest.raises(RedisConnectionError) as err:
                await in_flight
            assert isinstance(err.value, TRANSIENT_ERRORS)
            assert await wire.execute([("PING",)]) == [b"PONG"]
            # killed while idle: noticed before the next call, which goes on a new connection
            admin.execute_command("CLIENT", "KILL", "TYPE", "normal")
            await asyncio.sleep(0.05)
            assert await wire.execute([("PING",)]) == [b"PONG"]
    finally:
        admin.close()


class _Server:
    """A TCP server on 127.0.0.1 that answers as told: nothing (a hung server),
    garbage, more replies than asked, or closes."""

    def __init__(self, answer):
        self.answer = answer
        self.server = None

    async def __aenter__(self):
        async def handle(reader, writer):
            try:
                while data := await reader.read(65536):
                    reply = self.answer(data)
                    if reply is None:
                        continue
                    if reply == b"CLOSE":
                        writer.close()
                        return
                    writer.write(reply)
            except ConnectionError:
                pass

        self.server = await asyncio.start_server(handle, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def __aexit__(self, *exc):
        self.server.close()


async def test_a_hung_server_is_a_timeout_and_later_replies_go_to_nobody():
    async with _Server(lambda data: None) as port:
        wire = Wire("127.0.0.1", port, timeout=0.2)
        with pytest.raises(RedisTimeoutError):
            await wire.execute([("PING",)])
        assert isinstance(RedisTimeoutError("x"), TRANSIENT_ERRORS)
        # the connection was closed: the next call is on a new one
        first = wire._proto
        with pytest.raises(RedisTimeoutError):
            await wire.execute([("PING",)])
        assert wire._proto is not first
        await wire.aclose()


@pytest.mark.parametrize("answer, error", [
    (b"?not resp\r\n", "protocol error"),
    (b"+PONG\r\n+PONG\r\n", "nobody asked"),
    (b"CLOSE", "lost"),
])
async def test_garbage_extra_replies_and_a_close_fail_the_call(answer, error):
    async with _Server(lambda data: answer) as port:
        wire = Wire("127.0.0.1", port, timeout=2)
        with pytest.raises(RedisConnectionError, match=error) if error != "nobody asked" else _extra(wire):
            await wire.execute([("PING",)])
        await wire.aclose()


class _extra:
    """One PING answered twice: the call got its reply, the connection is closed
    (the second reply belongs to no call)."""

    def __init__(self, wire):
        self.wire = wire

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        assert exc[0] is None
        assert isinstance(self.wire._proto.closed, RedisConnectionError)


async def test_a_refused_connection_is_a_connection_error():
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    with pytest.raises(RedisConnectionError, match="cannot connect"):
        await Wire("127.0.0.1", port).execute([("PING",)])


async def test_cluster_tls_and_unix_sockets_keep_redis_pys_pipeline(redis_url):
    from redis.asyncio import Redis

    assert Wire.for_client(Redis.from_url(redis_url.replace("redis://", "rediss://"))) is None
    assert Wire.for_client(Redis(unix_socket_path="/tmp/nowhere.sock")) is None
    assert Wire.for_client(Redis.from_url(redis_url)) is not None


async def test_a_cancelled_blocking_call_closes_its_connection_so_the_next_call_does_not_wait(redis_url):
    async with _client_and_wire(redis_url) as (client, wire):
        blocked = asyncio.ensure_future(wire.execute([("XREAD", "BLOCK", 3000, "STREAMS", "w:s", "0-0")]))
        await asyncio.sleep(0.1)
        first = wire._proto
        blocked.cancel()
        with pytest.raises(asyncio.CancelledError):
            await blocked
        async with asyncio.timeout(1):  # not behind the 3 s block
            assert await wire.execute([("PING",)]) == [b"PONG"]
        assert wire._proto is not first


async def test_the_api_idempotency_answers_the_same_on_the_wire_and_on_redis_py(redis_url):
    from types import SimpleNamespace

    from pipeline.api.idempotency import Idempotency

    async with _client_and_wire(redis_url) as (client, wire):
        for name, w in (("py", None), ("wire", wire)):
            idem = Idempotency(SimpleNamespace(client=client, wire=w, ns=f"w{name}", idempotency_ttl=60))
            claim = (idem.key("b1", "shop"), b'{"fp":"x"}', {"fp": "x"})
            assert await idem.claim({0: claim}) == ([0], {})
            assert await idem.claim({1: claim}) == ([], {1: {"fp": "x"}})  # a repeat finds the claim
            await idem.confirm([claim])
            assert await idem.claim({2: claim}) == ([], {2: {"fp": "x", "st": "ok"}})
            await idem.release([claim])  # no longer ours (confirmed): kept
            assert await client.get(claim[0]) is not None


async def test_run_commands_raises_the_first_error_or_returns_it_on_both_paths(redis_url):
    async with _client_and_wire(redis_url) as (client, wire):
        commands = [("SET", "w:k", "v"), ("INCR", "w:k"), ("GET", "w:k")]
        for w in (None, wire):
            with pytest.raises(ResponseError, match="not an integer"):
                await run_commands(client, w, commands)
            ok, err, value = await run_commands(client, w, commands, raise_on_error=False)
            assert ok in (True, b"OK") and isinstance(err, ResponseError) and value == b"v"


async def test_one_call_for_every_partition_of_a_flush_and_an_error_stays_with_its_partition(redis_url, redis_sync):
    """To one server a batch is one ``EVALSHA PRODUCE_MANY`` (pipeline/transport/produce.py):
    the same offsets and entries as one PRODUCE per partition (what a cluster gets);
    a fenced partition and one whose stream key holds another type fail alone,
    with the error PRODUCE answers, and write nothing."""
    async with _client_and_wire(redis_url) as (client, wire):
        await load_produce(client)

        async def flush(together: bool) -> list:
            redis_sync.set(KEYS.stream("w.bad", 0), "not a stream")
            batch = ProduceBatch(client, KEYS, wire)
            batch.together = together
            batch.add("w.t", 0, "", ENTRIES)
            batch.add("w.fenced", 0, "token-of-nobody", ENTRIES)
            batch.add("w.bad", 0, "", ENTRIES[:1])
            batch.add("w.t", 1, "", ENTRIES[1:])
            return await batch.run()

        redis_sync.config_resetstat()
        apart = await flush(False)
        assert redis_sync.info("commandstats")["cmdstat_evalsha"]["calls"] == 4
        streams_apart = {p: redis_sync.xrange(KEYS.stream("w.t", p)) for p in (0, 1)}
        redis_sync.flushall()
        await load_produce(client)
        redis_sync.config_resetstat()
        together = await flush(True)
        assert redis_sync.info("commandstats")["cmdstat_evalsha"]["calls"] == 1
        streams_together = {p: redis_sync.xrange(KEYS.stream("w.t", p)) for p in (0, 1)}
        assert together[0] == apart[0] == 0 and together[3] == apart[3] == 0
        assert isinstance(together[1], ResponseError) and str(together[1]) == str(apart[1])
        # a command's error: its text (PRODUCE's error reply adds where in the script it was)
        assert isinstance(together[2], ResponseError) and str(apart[2]).startswith(str(together[2]).rstrip(")"))
        assert str(together[1]).startswith("FENCED") and str(together[2]).startswith("WRONGTYPE")
        assert not redis_sync.exists(KEYS.stream("w.fenced", 0))
        strip = lambda s: {k: [(i, {f: v for f, v in fields.items() if f != b"t"}) for i, fields in e]
                           for k, e in s.items()}
        assert strip(streams_together) == strip(streams_apart) and len(streams_together[0]) == 3


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_call_right_after_the_connection_closed_goes_on_a_new_one(redis_url, loop):
    """The loop closed the connection (the server died) and its ``connection_lost``
    has not run yet, a turn later: a call made in between connects again, instead
    of writing to the closed transport (uvloop raised RuntimeError there, which
    crashed the producer in the Redis restart drill; asyncio's dropped the write
    and the call waited out its timeout)."""
    import time

    import uvloop

    async def main():
        async with _client_and_wire(redis_url) as (_client, wire):
            assert await wire.execute([("SET", "w:closed", "1")]) == [b"OK"]
            old = wire._proto
            old.transport.close()  # connection_lost is only scheduled
            assert old.closed is None
            t0 = time.monotonic()
            assert await wire.execute([("GET", "w:closed")]) == [b"1"]
            assert time.monotonic() - t0 < 1.0 and wire._proto is not old
            # a handle the loop closed before saying so (uvloop's RuntimeError on write):
            # the call fails as a lost connection, which the producer retries
            proto, real = wire._proto, wire._proto.transport

            class Closed:
                def is_closing(self):
                    return False

                def write(self, data):
                    raise RuntimeError("unable to perform operation on <TCPTransport closed=True>")

                def close(self):
                    real.close()

            proto.transport = Closed()
            with pytest.raises(RedisConnectionError) as err:
                await wire.execute([("GET", "w:closed")])
            assert isinstance(err.value, TRANSIENT_ERRORS) and proto.closed is not None
            assert await wire.execute([("GET", "w:closed")]) == [b"1"]  # and the next call connects again

    with asyncio.Runner(loop_factory=uvloop.new_event_loop if loop == "uvloop" else None) as runner:
        runner.run(main())
