"""A connection of our own to one Redis server, for the producer's writes
(docs/adr/0005).

A producer flush is one pipeline of ``EVALSHA PRODUCE`` calls (:mod:`.produce`),
about 0.4 per notification on each worker. Through redis-py a pipeline costs
~165 µs of client CPU on this machine (its pipeline object, the pool's checks, a
task made by ``wait_for`` around every write, a timeout context per reply); the
same bytes written and read here cost ~61 µs (bench/wire.py, sequential calls). What is
ours: the commands of a call are packed by hiredis and written at once, the
replies are read by hiredis in the order they come and handed to the caller of
that call; several calls may be in flight on one connection (replies come in
order). What it keeps from redis-py: its error classes (``NOSCRIPT`` is
:class:`redis.exceptions.NoScriptError`, as the callers test), its
``ConnectionError`` and ``TimeoutError``, which the producer retries.

A lost connection fails every call in flight with ``ConnectionError`` (a call
may have run: the producer's resend is at-least-once, as it was); a call not
answered within ``timeout`` seconds closes the connection the same way (a hung
server). The next call connects again (AUTH and SELECT as the URL says).

Only a plain TCP connection to a single server: a cluster client, TLS or a Unix
socket keep redis-py's pipeline (:meth:`Wire.for_client` answers ``None``).
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from typing import Any, Optional, Sequence

import hiredis
from redis._parsers.base import BaseParser
from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse
from redis.exceptions import TimeoutError as RedisTimeoutError

from .client import is_cluster

__all__ = ["Wire", "run_commands"]

#: seconds a call waits for its replies when the client sets no socket timeout
DEFAULT_TIMEOUT = 5.0


def _reply_error(message: str) -> Exception:
    """The exception redis-py makes of an error reply (``NOSCRIPT ...`` →
    ``NoScriptError``, ``WRONGPASS`` → ``AuthenticationError``...)."""
    return BaseParser.parse_error(message)


class _Call:
    __slots__ = ("future", "expected", "replies")

    def __init__(self, future: "asyncio.Future[list]", expected: int) -> None:
        self.future = future
        self.expected = expected
        self.replies: list = []


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: Optional[asyncio.Transport] = None
        self.reader = hiredis.Reader(protocolError=InvalidResponse, replyError=_reply_error)
        self.calls: deque[_Call] = deque()
        self.closed: Optional[BaseException] = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:  # as redis-py's connections: no Nagle delay, keepalive probes
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)

    def data_received(self, data: bytes) -> None:
        reader = self.reader
        reader.feed(data)
        calls = self.calls
        while True:
            try:
                reply = reader.gets()
            except InvalidResponse as exc:  # not RESP: nothing after it can be trusted
                self.fail(RedisConnectionError(f"protocol error from the server: {exc}"))
                return
            if reply is False:
                return
            if not calls:
                self.fail(RedisConnectionError("a reply nobody asked for"))
                return
            call = calls[0]
            call.replies.append(reply)
            if len(call.replies) == call.expected:
                calls.popleft()
                if not call.future.done():
                    call.future.set_result(call.replies)

    def connection_lost(self, exc: Optional[BaseException]) -> None:
        self.fail(RedisConnectionError(f"connection to the server lost: {exc or 'closed'}"))

    def fail(self, exc: BaseException) -> None:
        """Close, and fail every call in flight with ``exc``."""
        if self.closed is None:
            self.closed = exc
        if self.transport is not None:
            self.transport.close()
        while self.calls:
            fut = self.calls.popleft().future
            if not fut.done():
                fut.set_exception(exc)


class Wire:
    """Pipelines of commands on one connection: :meth:`execute`."""

    def __init__(self, host: str, port: int, *, db: int = 0, username: Optional[str] = None,
                 password: Optional[str] = None, timeout: Optional[float] = None,
                 connect_timeout: Optional[float] = None) -> None:
        self.host, self.port, self.db = host, port, int(db or 0)
        self.username, self.password = username, password
        self.timeout = timeout or DEFAULT_TIMEOUT
        self.connect_timeout = connect_timeout or self.timeout
        self._proto: Optional[_Protocol] = None
        self._opening: Optional[asyncio.Future] = None

    @classmethod
    def for_client(cls, client: Any) -> Optional["Wire"]:
        """A wire to the server of a redis-py asyncio client, or ``None`` where the
        client's own pipeline stays (a cluster, TLS, a Unix socket)."""
        if is_cluster(client):
            return None
        pool = client.connection_pool
        if not issubclass(pool.connection_class, Connection) or issubclass(
                pool.connection_class, (SSLConnection, UnixDomainSocketConnection)):
            return None
        kw = pool.connection_kwargs
        return cls(kw.get("host", "localhost"), int(kw.get("port", 6379)), db=kw.get("db", 0),
                   username=kw.get("username"), password=kw.get("password"),
                   timeout=kw.get("socket_timeout"), connect_timeout=kw.get("socket_connect_timeout"))

    async def execute(self, commands: Sequence[Sequence[Any]]) -> list:
        """Send ``commands`` in one write; their replies, in order. An error reply is
        returned as its exception (redis-py's class), not raised. Raises
        ``ConnectionError`` when the connection is lost before every reply came
        (some of the commands may have run) and ``TimeoutError`` after ``timeout``
        seconds without them: the connection is closed, its late replies would
        belong to nobody. A call cancelled before its replies came closes the
        connection too, as redis-py does: the next call must not wait behind
        them."""
        proto = self._proto
        # a connection the loop closed whose connection_lost has not run yet (it comes
        # a turn later) is as lost: uvloop refuses a write on it with RuntimeError
        if proto is None or proto.closed is not None or proto.transport is None or proto.transport.is_closing():
            proto = await self._connect()
        buf = b"".join([hiredis.pack_command(tuple(c)) for c in commands])
        loop = asyncio.get_running_loop()
        call = _Call(loop.create_future(), len(commands))
        proto.calls.append(call)
        assert proto.transport is not None
        try:
            proto.transport.write(buf)
        except (RuntimeError, OSError) as exc:  # closed under us: every call on it fails as a lost connection
            proto.fail(RedisConnectionError(f"connection to the server lost: {exc}"))
        timer = loop.call_later(self.timeout, self._timed_out, proto, call)
        try:
            return await call.future
        except asyncio.CancelledError:
            if len(call.replies) < call.expected:
                proto.fail(RedisConnectionError("a call was cancelled before its replies came"))
            raise
        finally:
            timer.cancel()

    def _timed_out(self, proto: _Protocol, call: _Call) -> None:
        if not call.future.done():
            proto.fail(RedisTimeoutError(f"no reply from {self.host}:{self.port} in time"))

    async def _connect(self) -> _Protocol:
        # concurrent callers share one attempt
        if self._opening is None:
            self._opening = asyncio.ensure_future(self._open())
        opening = self._opening
        try:
            return await asyncio.shield(opening)
        finally:
            if opening.done():
                self._opening = None

    async def _open(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _t, proto = await loop.create_connection(_Protocol, self.host, self.port)
        except (OSError, asyncio.TimeoutError) as exc:
            raise RedisConnectionError(f"cannot connect to {self.host}:{self.port}: {exc}") from exc
        hello: list[tuple] = []
        if self.password:
            hello.append(("AUTH", self.username, self.password) if self.username else ("AUTH", self.password))
        if self.db:
            hello.append(("SELECT", self.db))
        self._proto = proto
        if hello:
            for reply in await self.execute(hello):
                if isinstance(reply, Exception):
                    proto.fail(RedisConnectionError("closed after a refused handshake"))
                    raise reply
        return proto

    async def aclose(self) -> None:
        proto, self._proto = self._proto, None
        if proto is not None:
            proto.fail(RedisConnectionError("closed by the client"))


async def run_commands(client: Any, wire: Optional[Wire], commands: Sequence[Sequence[Any]],
                       raise_on_error: bool = True) -> list:
    """``commands`` in one round trip: on ``wire`` when there is one, else as one
    non-transactional redis-py pipeline of ``client``. Each reply in order; an
    error reply raised (the first one), or with ``raise_on_error=False`` returned
    as its exception, as redis-py's ``pipeline.execute`` does either way. Replies
    on the wire are raw (``SET`` answers ``b"OK"``, not redis-py's ``True``)."""
    if wire is None:
        pipe = client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        return list(await pipe.execute(raise_on_error=raise_on_error))
    replies = await wire.execute(commands)
    if raise_on_error:
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
    return replies
