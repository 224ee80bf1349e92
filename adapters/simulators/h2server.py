"""A small HTTP/2 server on asyncio + the ``h2`` state machine (cleartext,
prior knowledge, RFC 9113 §3.3), enough for the APNs simulator: concurrent
streams, flow control on responses, requests handled as tasks so a slow or
hanging answer on one stream does not block the others."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from typing import Awaitable, Callable, Optional

import h2.config
import h2.connection
import h2.events
import h2.exceptions

__all__ = ["H2Server", "H2Request", "H2Handler"]

log = logging.getLogger("notify.sim.h2")


class H2Request:
    __slots__ = ("method", "path", "headers", "body", "stream_id")

    def __init__(self, stream_id: int, headers: list[tuple[str, str]]) -> None:
        self.stream_id = stream_id
        self.headers: dict[str, str] = {}
        for k, v in headers:
            self.headers[k.lower()] = v
        self.method = self.headers.get(":method", "GET")
        self.path = self.headers.get(":path", "/")
        self.body = bytearray()


#: handler(request) -> (status, headers, body)
H2Handler = Callable[[H2Request], Awaitable[tuple[int, list[tuple[str, str]], bytes]]]


class _Protocol(asyncio.Protocol):
    def __init__(self, server: "H2Server") -> None:
        self.server = server
        self.conn = h2.connection.H2Connection(
            config=h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
        )
        self.transport: Optional[asyncio.Transport] = None
        self.requests: dict[int, H2Request] = {}
        self.window_waiters: dict[int, asyncio.Event] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.closed = False

    # -------------------------------------------------------------- asyncio

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server._protocols.add(self)
        self.conn.initiate_connection()
        self._flush()

    def connection_lost(self, exc: Optional[BaseException]) -> None:
        self.closed = True
        self.server._protocols.discard(self)
        for t in list(self.tasks):
            t.cancel()
        for ev in self.window_waiters.values():
            ev.set()

    def data_received(self, data: bytes) -> None:
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError:
            self._flush()
            if self.transport:
                self.transport.close()
            return
        for ev in events:
            if isinstance(ev, h2.events.RequestReceived):
                self.requests[ev.stream_id] = H2Request(ev.stream_id, ev.headers)  # type: ignore[arg-type]
            elif isinstance(ev, h2.events.DataReceived):
                req = self.requests.get(ev.stream_id)
                if req is not None:
                    req.body.extend(ev.data)
                with contextlib.suppress(h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
                    self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, h2.events.StreamEnded):  # also emitted for HEADERS+END_STREAM
                self._dispatch(ev.stream_id)
            elif isinstance(ev, h2.events.StreamReset):
                self.requests.pop(ev.stream_id, None)
                w = self.window_waiters.pop(ev.stream_id, None)
                if w:
                    w.set()
            elif isinstance(ev, h2.events.WindowUpdated):
                if ev.stream_id == 0:
                    for w in self.window_waiters.values():
                        w.set()
                else:
                    w = self.window_waiters.get(ev.stream_id)
                    if w:
                        w.set()
            elif isinstance(ev, h2.events.ConnectionTerminated):
                self._flush()
                if self.transport:
                    self.transport.close()
                return
        self._flush()

    # -------------------------------------------------------------- h2

    def _flush(self) -> None:
        data = self.conn.data_to_send()
        if data and self.transport and not self.transport.is_closing():
            self.transport.write(data)

    def _dispatch(self, stream_id: int) -> None:
        req = self.requests.get(stream_id)
        if req is None:
            return
        task = asyncio.ensure_future(self._handle(req))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _handle(self, req: H2Request) -> None:
        try:
            status, headers, body = await self.server.handler(req)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001
            log.exception("h2 handler failed")
            status, headers, body = 500, [("content-type", "application/json")], b'{"reason":"InternalServerError"}'
        if self.closed or req.stream_id not in self.requests:
            return
        try:
            hdrs = [(":status", str(status)), ("content-length", str(len(body)))] + headers
            self.conn.send_headers(req.stream_id, hdrs, end_stream=not body)
            self._flush()
            await self._send_body(req.stream_id, body)
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError, KeyError):
            pass
        finally:
            self.requests.pop(req.stream_id, None)
            self.window_waiters.pop(req.stream_id, None)

    async def _send_body(self, stream_id: int, body: bytes) -> None:
        view = memoryview(body)
        while view and not self.closed:
            window = min(self.conn.local_flow_control_window(stream_id), self.conn.max_outbound_frame_size)
            if window <= 0:
                ev = self.window_waiters.setdefault(stream_id, asyncio.Event())
                ev.clear()
                await ev.wait()
                if stream_id not in self.requests:
                    return
                continue
            chunk, view = view[:window], view[window:]
            self.conn.send_data(stream_id, bytes(chunk), end_stream=not view)
            self._flush()


class H2Server:
    """``ssl_context`` given: TLS with ALPN ``h2`` (as APNs); else cleartext h2c."""

    def __init__(self, handler: H2Handler, host: str = "127.0.0.1", port: int = 0, ssl_context: Optional[ssl.SSLContext] = None) -> None:
        self.handler = handler
        self.host = host
        self.port = port
        self.ssl_context = ssl_context
        if ssl_context is not None:
            ssl_context.set_alpn_protocols(["h2"])
        self._server: Optional[asyncio.AbstractServer] = None
        self._protocols: set[_Protocol] = set()

    async def start(self) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Protocol(self), self.host, self.port, ssl=self.ssl_context)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for p in list(self._protocols):
            tasks = list(p.tasks)
            for t in tasks:
                t.cancel()
            with contextlib.suppress(Exception):
                p.conn.close_connection()
                p._flush()
            if p.transport:
                p.transport.close()
            for t in tasks:
                with contextlib.suppress(BaseException):
                    await t
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 1.0)
        self._server = None
