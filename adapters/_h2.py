"""HTTP/2 for the push adapters: a small client of ours on the ``h2`` state
machine over an asyncio connection (TLS with ALPN ``h2``, or cleartext with
prior knowledge for the simulators), as an httpx transport
(:class:`H2Transport`: FCM with ``http2``, any client of :func:`adapters._http.make_client`
with ``http2=True``) and called directly (:meth:`H2Transport.request`: APNs,
without httpx's client layers). Both raise httpx's exceptions, which
:func:`adapters._http.exception_result` maps.

Measured against the APNs simulator in another process (bench/adapters.py,
issue 18 item 3, bench/RESULTS.md): httpx's own HTTP/2 transport (httpcore)
cost 1.7-1.9 ms of client CPU per push; this transport under httpx's client
0.68-0.80 ms, called directly 0.38-0.50 ms. What went: httpcore's anyio locks,
events and cancellation shields around every request (each asking
``current_async_library``, which tries ``import sniffio``, not installed: a
search of sys.path per call), its pool bookkeeping, h2's Huffman coding of
every literal (see :class:`_Encoder`), a second write per request, and httpx's
URL merging and cookie extraction. What is left is mostly ``h2`` framing and
HPACK, and the socket writes.

One connection per origin (scheme, host, port), every request a stream on it:

* the server's SETTINGS are awaited before the first request, and no more
  streams are opened than its ``max_concurrent_streams`` says (APNs starts a
  connection at 1 and raises it once the provider token is accepted): a
  request waits for a free stream (``pool`` timeout → ``httpx.PoolTimeout``,
  never sent);
* flow control is honoured both ways: a body waits for WINDOW_UPDATE when the
  server's window is spent, received data is acknowledged as it is read;
* GOAWAY: the connection takes no new streams; its streams above
  ``last_stream_id`` were not processed (RFC 9113 §6.8) and are sent again on a
  new connection, as are streams refused with REFUSED_STREAM (§8.7), up to
  ``MAX_RESENDS`` times (then ``httpx.ConnectError``: never processed); those
  at or below it may still be answered, and if the connection closes before
  they are they end as ``httpx.RemoteProtocolError`` (the outcome is unknown);
* a request whose HEADERS were sent and which gets no complete answer within
  the ``read`` timeout is reset (RST_STREAM CANCEL) and raises
  ``httpx.ReadTimeout``; a connection lost under it raises
  ``httpx.RemoteProtocolError``: both are TIMEOUT_UNKNOWN;
* connecting (TCP, TLS, ALPN, the server's SETTINGS) that fails or takes more
  than the ``connect`` timeout raises ``httpx.ConnectError`` /
  ``httpx.ConnectTimeout`` (never sent): concurrent requests share one attempt.

The connection is an :class:`asyncio.Protocol` (``loop.create_connection``)
rather than a reader task over streams: frames are fed to ``h2`` as they
arrive, without a task switch per read. There is no keep-alive PING: a
connection the network dropped silently shows as the read timeout of the next
request on it (TIMEOUT_UNKNOWN), as it did over httpx.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import ssl
from typing import Any, Mapping, NamedTuple, Optional

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import hpack
import httpx

__all__ = ["H2Transport", "Origin"]

log = logging.getLogger("notify.adapters.h2")

#: headers of HTTP/1.1 connections that HTTP/2 forbids (RFC 9113 §8.2.2), and
#: ``host``, which is ``:authority`` in HTTP/2
_DROPPED = frozenset({b"host", b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade"})
#: headers sent as literals kept out of the HPACK table (as ``:path`` always is,
#: with APNs' device token in it): those whose value is new on nearly every
#: request, which would only evict the headers that do repeat (the topic, the
#: push type, the content type) and make them literals again, and the
#: credentials (as h2 itself does)
UNINDEXED = frozenset({b"apns-id", b"apns-collapse-id", b"authorization", b"proxy-authorization"})
#: how many times a request refused unprocessed (GOAWAY, REFUSED_STREAM) is sent again
MAX_RESENDS = 3
#: connection-level receive window we announce (h2's default is 64 KiB - 1)
RECEIVE_WINDOW = 16 * 1024 * 1024


def _static_indexes() -> tuple[dict[tuple[bytes, bytes], bytes], dict[bytes, int]]:
    """HPACK's static table (RFC 7541 Appendix A): each (name, value) → its indexed
    field, ready to write; each name → its first index."""
    exact: dict[tuple[bytes, bytes], bytes] = {}
    names: dict[bytes, int] = {}
    for i, (name, value) in enumerate(hpack.table.HeaderTable.STATIC_TABLE, 1):
        exact.setdefault((name, value), bytes(_integer(i, 7, 0x80)))
        names.setdefault(name, i)
    return exact, names


def _integer(n: int, prefix: int, first: int) -> bytes:
    """An HPACK integer of ``prefix`` bits, its first byte's other bits ``first``
    (RFC 7541 5.1)."""
    if n < (1 << prefix) - 1:
        return bytes((first | n,))
    b = bytearray(hpack.hpack.encode_integer(n, prefix))
    b[0] |= first
    return bytes(b)


class _Encoder(hpack.Encoder):
    """HPACK with neither Huffman coding nor the dynamic table: a field of the
    static table is written as its index, any other as a literal *without
    indexing* (its name by index where the static table has it; never indexed for
    the fields h2 marks sensitive, the provider's bearer token). RFC 7541 lets an
    encoder choose so; the server's decoder reads it as ever.

    hpack's encoder Huffman-codes every literal in pure Python, and adds every
    literal to the dynamic table, where the device token's path, the apns-id and
    the collapse id of every request push out what repeats, so that each field
    was looked for in a linear search of a full table (bench/RESULTS.md
    "real-calls"). Here a field is one or two dict lookups; the requests are
    ~150 bytes longer on the wire. A table size the server sets is still signalled
    at the start of the next block (RFC 7541 4.2); with nothing ever added, no
    entry is evicted."""

    _exact, _names = _static_indexes()

    def encode(self, headers: Any, huffman: bool = True) -> bytes:
        block = []
        if self.header_table.resized:
            block.append(self._encode_table_size_change())
            self.header_table.resized = False
        exact, names = self._exact, self._names
        for header in headers:
            name, value = header[0], header[1]
            if isinstance(name, str):
                name = name.encode("utf-8")
            if isinstance(value, str):
                value = value.encode("utf-8")
            indexed = exact.get((name, value))
            if indexed is not None:
                block.append(indexed)
                continue
            never = (not header.indexable) if isinstance(header, hpack.HeaderTuple) else (
                len(header) > 2 and bool(header[2]))
            first = 0x10 if never else 0x00  # 0001: never indexed, 0000: without indexing
            i = names.get(name)
            if i is not None:
                block.append(_integer(i, 4, first))
            else:
                block.append(bytes((first,)))
                block.append(_integer(len(name), 7, 0))
                block.append(name)
            block.append(_integer(len(value), 7, 0))
            block.append(value)
        return b"".join(block)


class _Refused(Exception):
    """The server did not process the stream (above GOAWAY's last_stream_id, or
    REFUSED_STREAM), or the connection took no new streams: safe to send again."""


class _Stream:
    __slots__ = ("id", "done", "headers", "body", "window", "sent")

    def __init__(self, stream_id: int, done: asyncio.Future) -> None:
        self.id = stream_id
        self.done = done  #: result None when the answer is complete; an exception otherwise
        self.headers: list[tuple[bytes, bytes]] = []
        self.body = bytearray()
        self.window: Optional[asyncio.Future] = None  #: set while the body waits for WINDOW_UPDATE
        self.sent = False  #: the whole request (HEADERS and body) is on the wire


class _Connection(asyncio.Protocol):
    """One HTTP/2 connection: the ``h2`` state machine fed by asyncio."""

    def __init__(self, origin: str) -> None:
        self.origin = origin
        self.loop = asyncio.get_running_loop()
        config = h2.config.H2Configuration(client_side=True, header_encoding=None)
        self.h2 = h2.connection.H2Connection(config=config)
        self.h2.encoder = _Encoder()
        self.transport: Optional[asyncio.Transport] = None
        self.streams: dict[int, _Stream] = {}
        #: requests waiting for a free stream (futures set when one may be free)
        self.slot_waiters: collections.deque[asyncio.Future] = collections.deque()
        self.reserved = 0  #: streams promised to woken waiters that have not yet opened them
        self.ready: asyncio.Future = self.loop.create_future()  #: the server's first SETTINGS
        self.usable = True  #: False after GOAWAY, a lost connection or spent stream ids
        self.lost: Optional[str] = None  #: why the connection ended, once it has
        self._write_paused: Optional[asyncio.Future] = None
        self._flush_due = False  #: a flush is scheduled for the end of this turn (:meth:`_flush_soon`)

    # -------------------------------------------------------------- asyncio

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.h2.initiate_connection()
        self.h2.increment_flow_control_window(RECEIVE_WINDOW - self.h2.inbound_flow_control_window)
        self._flush()

    def connection_lost(self, exc: Optional[BaseException]) -> None:
        self._fail(f"connection lost: {exc or 'closed by the server'}")

    def pause_writing(self) -> None:
        if self._write_paused is None:
            self._write_paused = self.loop.create_future()

    def resume_writing(self) -> None:
        if self._write_paused is not None:
            if not self._write_paused.done():
                self._write_paused.set_result(None)
            self._write_paused = None

    def data_received(self, data: bytes) -> None:
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            self._flush()  # h2's GOAWAY
            self._fail(f"HTTP/2 protocol error: {exc}")
            if self.transport is not None:
                self.transport.close()
            return
        for ev in events:
            # the common events first; those not listed (pings, priorities, SETTINGS
            # acks, trailers, 1xx answers) need nothing from us (h2 answers pings)
            if isinstance(ev, h2.events.ResponseReceived):
                s = self.streams.get(ev.stream_id)
                if s is not None:
                    s.headers = ev.headers  # type: ignore[assignment]
            elif isinstance(ev, h2.events.DataReceived):
                s = self.streams.get(ev.stream_id)
                if s is not None:
                    s.body += ev.data
                # give the window back at once: answers are read whole
                if ev.flow_controlled_length:
                    try:
                        self.h2.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                    except h2.exceptions.StreamClosedError:
                        pass
            elif isinstance(ev, h2.events.StreamEnded):
                self._end(ev.stream_id, None)
            elif isinstance(ev, h2.events.StreamReset):
                code = ev.error_code
                if code == h2.errors.ErrorCodes.REFUSED_STREAM:
                    self._end(ev.stream_id, _Refused("stream refused (REFUSED_STREAM)"))
                else:
                    self._end(ev.stream_id, httpx.RemoteProtocolError(f"stream reset by the server: {code!r}"))
            elif isinstance(ev, h2.events.WindowUpdated):
                if ev.stream_id == 0:
                    for s in self.streams.values():
                        self._wake_window(s)
                else:
                    s = self.streams.get(ev.stream_id)
                    if s is not None:
                        self._wake_window(s)
            elif isinstance(ev, h2.events.RemoteSettingsChanged):
                if not self.ready.done():
                    self.ready.set_result(None)
                if h2.settings.SettingCodes.INITIAL_WINDOW_SIZE in ev.changed_settings:
                    for s in self.streams.values():
                        self._wake_window(s)
                self._wake_slots()
            elif isinstance(ev, h2.events.ConnectionTerminated):
                self._goaway(ev)
        self._flush()

    # -------------------------------------------------------------- h2 state

    def _flush(self) -> None:
        data = self.h2.data_to_send()
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def _flush_soon(self) -> None:
        """Flush at the end of this turn of the loop: the requests a lane starts
        together (its calls begin in the same turn) leave in one socket write
        instead of one each, and none waits longer than the turn."""
        if not self._flush_due:
            self._flush_due = True
            self.loop.call_soon(self._flush_turn)

    def _flush_turn(self) -> None:
        self._flush_due = False
        self._flush()

    def _end(self, stream_id: int, error: Optional[BaseException]) -> None:
        """The stream is over: answered (``error`` None) or failed."""
        s = self.streams.pop(stream_id, None)
        if s is None:
            return
        if not s.done.done():
            if error is None:
                s.done.set_result(None)
            else:
                s.done.set_exception(error)
                s.done.exception()  # retrieved: a body waiting for its window raises it instead
        if error is None and not s.sent:
            self._reset(stream_id)  # answered before the whole body went: end our side too
        self._wake_window(s, error)
        self._wake_slots()
        if not self.usable and not self.streams:
            self.close()  # drained after GOAWAY

    def _goaway(self, ev: h2.events.ConnectionTerminated) -> None:
        """No new streams; those above ``last_stream_id`` were not processed."""
        self.usable = False
        last = ev.last_stream_id if ev.last_stream_id is not None else 0
        reason = f"GOAWAY {ev.error_code!r} last_stream_id={last}"
        # APNs says why in the debug data ({"reason": "Shutdown"}, "BadCertificate", ...)
        log.log(logging.INFO if ev.error_code == h2.errors.ErrorCodes.NO_ERROR else logging.WARNING,
                "%s: %s %r", self.origin, reason, (ev.additional_data or b"")[:200])
        for sid in [sid for sid in self.streams if sid > last]:
            self._end(sid, _Refused(reason))
        self.lost = reason
        self._wake_slots()
        if self.streams:
            # h2 closes its state machine on any GOAWAY and would refuse the answers
            # still allowed to come (python-hyper/h2#1181): keep it open for the
            # streams at or below last_stream_id; no new stream is opened on it
            self.h2.state_machine.state = h2.connection.ConnectionState.CLIENT_OPEN
        else:
            self.close()

    def _fail(self, reason: str) -> None:
        """The connection is gone: every stream on it ends with an unknown outcome."""
        self.usable = False
        self.lost = reason
        if not self.ready.done():
            self.ready.set_exception(httpx.ConnectError(reason))
            self.ready.exception()  # retrieved: the opener may be gone
        for sid in list(self.streams):
            self._end(sid, httpx.RemoteProtocolError(reason))
        self._wake_slots()
        self.resume_writing()

    def _wake_window(self, s: _Stream, error: Optional[BaseException] = None) -> None:
        w = s.window
        if w is not None and not w.done():
            if error is None:
                w.set_result(None)
            else:
                w.set_exception(error)
                w.exception()
        s.window = None

    def _wake_slots(self) -> None:
        """Give free streams to the waiters, first come first served, each one
        reserved until its waiter runs (a newcomer cannot take it); when the
        connection takes no more streams, wake them all to go elsewhere."""
        if not self.usable:
            while self.slot_waiters:
                w = self.slot_waiters.popleft()
                if not w.done():
                    w.set_result(False)
            return
        while self.slot_waiters and self._free_slots() > 0:
            w = self.slot_waiters.popleft()
            if not w.done():  # not cancelled
                self.reserved += 1
                w.set_result(True)

    def _free_slots(self) -> int:
        return self.h2.remote_settings.max_concurrent_streams - len(self.streams) - self.reserved

    # -------------------------------------------------------------- requests

    async def request(self, headers: list[tuple[bytes, bytes]], body: bytes, timeout: dict[str, Any]) -> _Stream:
        """Send one request on a new stream and wait for its whole answer.

        Raises :class:`_Refused` when it was not processed (send it elsewhere),
        ``httpx.PoolTimeout`` when no stream came free in time, ``httpx.ReadTimeout``
        / ``httpx.WriteTimeout`` / ``httpx.RemoteProtocolError`` once HEADERS left."""
        if self._free_slots() <= 0:
            await self._wait_for_slot(timeout.get("pool"))
        if not self.usable:
            raise _Refused(self.lost or "connection closed")
        try:
            stream_id = self.h2.get_next_available_stream_id()
        except h2.exceptions.NoAvailableStreamIDError:
            self.usable = False  # stream ids spent: a new connection takes the next requests
            raise _Refused("stream ids spent") from None
        s = _Stream(stream_id, self.loop.create_future())
        try:
            self.h2.send_headers(stream_id, headers, end_stream=not body)
        except h2.exceptions.TooManyStreamsError:  # h2 still counts a stream we are done with
            raise _Refused("no free stream") from None
        self.streams[stream_id] = s
        # from here on the server may act on the request: no answer is an unknown outcome
        s.sent = not body
        try:
            async with asyncio.timeout(timeout.get("read")):
                if body:
                    await self._send_body(s, body)  # HEADERS and DATA in one write, with the turn's others
                else:
                    self._flush_soon()
                await s.done
        except TimeoutError:
            if s.sent:
                raise httpx.ReadTimeout(f"no answer on stream {stream_id} within the read timeout") from None
            raise httpx.WriteTimeout(f"stream {stream_id}: the server's flow-control window stayed shut") from None
        finally:
            if stream_id in self.streams:  # timed out or cancelled: free the stream
                self.streams.pop(stream_id)
                self._reset(stream_id)
                self._wake_slots()
                if not self.usable and not self.streams:
                    self.close()  # drained after GOAWAY
        return s

    async def _wait_for_slot(self, timeout: Optional[float]) -> None:
        """Wait in turn until a stream may be opened, or the connection takes no
        more (asyncio.timeout's TimeoutError: the transport's PoolTimeout)."""
        async with asyncio.timeout(timeout):
            while self.usable and self._free_slots() <= 0:
                w = self.loop.create_future()
                self.slot_waiters.append(w)
                try:
                    reserved = await w
                except BaseException:
                    if w.done() and not w.cancelled() and w.result():
                        self.reserved -= 1  # given a stream, then cancelled: pass it on
                        self._wake_slots()
                    raise
                if reserved:
                    self.reserved -= 1
                    return  # the stream is opened before anything else runs

    async def _send_body(self, s: _Stream, body: bytes) -> None:
        view = memoryview(body)
        while view:
            size = min(self.h2.local_flow_control_window(s.id), self.h2.max_outbound_frame_size, len(view))
            if size <= 0 or self._write_paused is not None:
                self._flush()
                if self._write_paused is not None:
                    await self._write_paused
                else:
                    s.window = self.loop.create_future()
                    await s.window
                if s.done.done():  # answered (or failed) before the whole body went
                    return
                continue
            chunk, view = view[:size], view[size:]
            self.h2.send_data(s.id, bytes(chunk), end_stream=not view)
            if view:
                self._flush()
        self._flush_soon()
        s.sent = True

    def _reset(self, stream_id: int) -> None:
        try:
            self.h2.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
            pass
        self._flush()

    def close(self) -> None:
        self.usable = False
        if self.transport is not None and not self.transport.is_closing():
            try:
                self.h2.close_connection()
            except h2.exceptions.ProtocolError:
                pass
            self._flush()
            self.transport.close()


class H2Transport(httpx.AsyncBaseTransport):
    """HTTP/2 to each origin over one multiplexed connection of ours.

    ``verify`` as httpx takes it (bool, CA bundle path or SSLContext). ``http://``
    URLs are HTTP/2 with prior knowledge (h2c), ``https://`` TLS with ALPN ``h2``."""

    def __init__(self, *, verify: Any = True) -> None:
        self._verify = verify
        self._ssl: Optional[ssl.SSLContext] = None
        self._conns: dict[str, _Connection] = {}
        self._opening: dict[str, asyncio.Task] = {}

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            ctx = self._verify if isinstance(self._verify, ssl.SSLContext) else httpx.create_ssl_context(
                verify=self._verify, trust_env=False)
            ctx.set_alpn_protocols(["h2"])
            self._ssl = ctx
        return self._ssl

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        body = request.content if isinstance(request.stream, httpx.ByteStream) else await request.aread()
        headers = [(k, v) for k, v in ((k.lower(), v) for k, v in request.headers.raw) if k not in _DROPPED]
        return await self.request(Origin.of(url), request.method.encode(), url.raw_path, headers, body,
                                  request.extensions.get("timeout", {}))

    async def request(self, origin: "Origin", method: bytes, path: bytes, headers: list[tuple[bytes, bytes]],
                      body: bytes, timeout: Mapping[str, Optional[float]]) -> httpx.Response:
        """One request without httpx's client layers (an adapter's own path: no URL
        to parse, no cookies to extract): ``headers`` with lowercase names and none
        of HTTP/1.1's connection headers; ``timeout`` as httpx's (``connect``,
        ``pool``, ``read`` seconds). The answer is read whole."""
        block: list[tuple[bytes, bytes]] = [
            (b":method", method), (b":authority", origin.authority), (b":scheme", origin.scheme),
            hpack.NeverIndexedHeaderTuple(b":path", path)]
        for k, v in headers:
            block.append(hpack.NeverIndexedHeaderTuple(k, v) if k in UNINDEXED else (k, v))
        refused = ""
        for _ in range(MAX_RESENDS + 1):
            conn = self._conns.get(origin.key)
            if conn is None or not conn.usable:
                conn = await self._connect(origin, timeout.get("connect"))
            try:
                s = await conn.request(block, body, timeout)
            except _Refused as exc:  # not processed: the next connection takes it
                refused = str(exc)
                continue
            except TimeoutError:  # waiting for a free stream
                raise httpx.PoolTimeout(f"no free HTTP/2 stream to {origin.key} within the pool timeout") from None
            return httpx.Response(int(_status(s.headers)), headers=[h for h in s.headers if h[0][:1] != b":"],
                                  content=bytes(s.body), extensions={"http_version": b"HTTP/2"})
        # refused each time before the server processed it: safe to send again later
        raise httpx.ConnectError(f"{origin.key} refused the request {MAX_RESENDS + 1} times unprocessed: {refused}")

    async def _connect(self, origin: "Origin", timeout: Optional[float]) -> _Connection:
        """The origin's connection, opened once for all the requests waiting for it."""
        task = self._opening.get(origin.key)
        if task is None:
            task = asyncio.ensure_future(self._open(origin, timeout))
            self._opening[origin.key] = task

            def done(t: asyncio.Task) -> None:
                self._opening.pop(origin.key, None)
                if not t.cancelled() and t.exception() is None:
                    self._conns[origin.key] = t.result()

            task.add_done_callback(done)
        return await asyncio.shield(task)

    async def _open(self, origin: "Origin", timeout: Optional[float]) -> _Connection:
        loop = asyncio.get_running_loop()
        transport = None
        tls = origin.scheme == b"https"
        try:
            async with asyncio.timeout(timeout):
                transport, conn = await loop.create_connection(
                    lambda: _Connection(origin.key), origin.host, origin.port, ssl=self._ssl_context() if tls else None,
                    server_hostname=origin.host if tls else None)
                if tls:
                    alpn = transport.get_extra_info("ssl_object").selected_alpn_protocol()
                    if alpn != "h2":
                        raise httpx.ConnectError(f"{origin} did not agree to HTTP/2 (ALPN: {alpn})")
                await conn.ready  # the server's SETTINGS: how many streams we may open
                return conn
        except TimeoutError:
            if transport is not None:
                transport.close()
            raise httpx.ConnectTimeout(f"connecting to {origin}: timed out") from None
        except httpx.ConnectError:
            if transport is not None:
                transport.close()
            raise
        except (OSError, ssl.SSLError) as exc:
            if transport is not None:
                transport.close()
            raise httpx.ConnectError(f"connecting to {origin}: {type(exc).__name__}: {exc}") from exc

    async def aclose(self) -> None:
        for task in list(self._opening.values()):
            task.cancel()
        for conn in list(self._conns.values()):
            conn.close()
        self._conns.clear()


class Origin(NamedTuple):
    """Where requests go: one connection each (:meth:`Origin.of` an URL)."""

    key: str  #: ``scheme://host:port``
    scheme: bytes
    host: str
    port: int
    authority: bytes  #: ``:authority``: the URL's host[:port]

    @classmethod
    def of(cls, url: httpx.URL | str) -> "Origin":
        url = httpx.URL(url) if isinstance(url, str) else url
        if url.scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol(f"HTTP/2 over {url.scheme!r}: only http (h2c) and https")
        port = url.port or (443 if url.scheme == "https" else 80)
        return cls(f"{url.scheme}://{url.host}:{port}", url.scheme.encode(), url.host, port, url.netloc)


def _status(headers: list[tuple[bytes, bytes]]) -> bytes:
    for k, v in headers:
        if k == b":status":
            return v
    raise httpx.RemoteProtocolError("an answer without :status")
