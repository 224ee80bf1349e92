"""An httpx transport that sends over aiohttp: the HTTP/1.1 adapters keep httpx's
API (requests, responses, the exceptions :func:`adapters._http.exception_result`
maps) and pay aiohttp's cost per call.

Measured against the Twilio simulator in another process (bench/adapters.py):
httpx's own transport (httpcore over anyio) cost 1.5 ms of client CPU per call
at concurrency 1 and 3.3 ms at 50, because its pool checks every connection of
the pool for every request (``has_expired`` → ``is_socket_readable`` per
connection); aiohttp costs 0.3 ms and stays flat with concurrency.

Errors are mapped by whether the request may have left, which decides between
a safe resend and a reconciliation (``adapters/_http.py exception_result``):

* connecting failed or timed out → ``httpx.ConnectError`` / ``ConnectTimeout``
  (never sent);
* waiting for the connection pool timed out → ``httpx.PoolTimeout`` (never sent);
* a read timed out → ``httpx.ReadTimeout``; the connection dropped or the
  answer was malformed → ``httpx.RemoteProtocolError`` / ``ReadError`` (the
  request may have been processed: its fate is unknown).

HTTP/2 does not come here: it goes over our client on ``h2``
(:mod:`adapters._h2`), which APNs calls directly and FCM uses only with
``http2 = true`` (by default FCM is HTTP/1.1 over this transport).

Called directly (:meth:`AiohttpTransport.send`, issue 18 item 3): the HTTP/1.1
adapters send their requests, built once per call (method, URL, headers with the
credentials, body bytes), straight through the same aiohttp session, without
httpx's client layers (URL merging, cookies, the auth flow, event hooks, the
redirect loop, httpx's Request and Response models), which were 0.3-0.4 ms of
the 0.55-0.7 ms a call cost (bench/RESULTS.md, "adapters: HTTP/1.1 without httpx's
client layers"). The answer comes back as an :class:`Answer` (what the
adapters read of an ``httpx.Response``, with httpx's semantics), and the errors
are the same httpx exceptions, mapped the same way (:func:`_raise_mapped`).
:class:`adapters._http.Direct` builds the requests as httpx would have.
"""

from __future__ import annotations

import asyncio
import codecs
import email.message
import json
import ssl
from typing import Any, AsyncIterator, Iterable, NoReturn, Optional, Union

import aiohttp
import httpx
import yarl

__all__ = ["AiohttpTransport", "Answer", "client_timeout"]


class _Body(httpx.AsyncByteStream):
    def __init__(self, data: bytes) -> None:
        self._data = data

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self._data


class AiohttpTransport(httpx.AsyncBaseTransport):
    """``max_connections`` connections kept alive per client (aiohttp's connector
    queues the rest in order, at O(1) a request)."""

    def __init__(self, *, max_connections: int = 100, verify: Any = True, keepalive_s: float = 30.0) -> None:
        self._max = max_connections
        self._verify = verify
        self._keepalive = keepalive_s
        self._session: Optional[aiohttp.ClientSession] = None

    def _ssl(self) -> Any:
        if self._verify is True:
            return None  # aiohttp's default verification
        if self._verify is False:
            return False
        if isinstance(self._verify, ssl.SSLContext):
            return self._verify
        return ssl.create_default_context(cafile=self._verify)

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self._max, limit_per_host=self._max,
                                             keepalive_timeout=self._keepalive, ssl=self._ssl())
            self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                                  skip_auto_headers=("User-Agent",), cookie_jar=aiohttp.DummyCookieJar())
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeout = request.extensions.get("timeout", {})
        body = request.content if isinstance(request.stream, httpx.ByteStream) else await request.aread()
        ct = client_timeout(timeout.get("connect"), timeout.get("read"), timeout.get("pool"))
        extra: dict[str, Any] = {}
        if request.extensions.get("sni_hostname"):  # pinned to a checked address (the webhook guard)
            extra["server_hostname"] = request.extensions["sni_hostname"]
        sent = False
        try:
            async with self._client().request(
                request.method, str(request.url), headers=list(request.headers.multi_items()), data=body or None,
                timeout=ct, allow_redirects=False, compress=None, **extra,
            ) as resp:
                sent = True
                content = await resp.read()
                # the reason's bytes as received (aiohttp keeps those that are not UTF-8 as
                # surrogates: encoding them strictly raised, for an answer already had)
                return httpx.Response(resp.status, headers=list(resp.raw_headers), stream=_Body(content),
                                      extensions={"http_version": b"HTTP/1.1", "reason_phrase": resp.reason.encode(
                                          errors="surrogateescape") if resp.reason else b""})
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            _raise_mapped(exc, sent, request)

    async def send(self, method: str, url: Union[yarl.URL, str], headers: Iterable[tuple[str, str]], body: bytes,
                   timeout: aiohttp.ClientTimeout, server_hostname: Optional[str] = None) -> "Answer":
        """One request without httpx's client layers: ``url`` absolute (a ``yarl.URL``
        built once, or the string httpx would have sent), ``headers`` as they go on
        the wire (nothing is added but what aiohttp adds when a header is missing:
        give ``host``, ``accept``, ``accept-encoding``, ``content-length``),
        ``timeout`` from :func:`client_timeout`, ``server_hostname`` the TLS name of
        a request pinned to an address. Redirects are not followed, the answer is
        read whole (decoded as httpx decodes a ``Content-Encoding``); errors raise
        the httpx exceptions :meth:`handle_async_request` raises."""
        extra: dict[str, Any] = {"server_hostname": server_hostname} if server_hostname else {}
        sent = False
        try:
            async with self._client().request(method, url, headers=headers, data=body or None, timeout=timeout,
                                              allow_redirects=False, compress=None, **extra) as resp:
                sent = True
                content = await resp.read()
                raw = resp.raw_headers
                if "Content-Encoding" in resp.headers:  # decoded exactly as httpx did (or its DecodingError)
                    content = httpx.Response(resp.status, headers=list(raw), content=content).content
                return Answer(resp.status, raw, content, resp.reason)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            _raise_mapped(exc, sent)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def client_timeout(connect: Optional[float], read: Optional[float], pool: Optional[float]) -> aiohttp.ClientTimeout:
    """aiohttp's timeouts for httpx's ``connect``, ``read`` and ``pool`` (seconds):
    ``connect`` (aiohttp: waiting for the pool and connecting) is httpx's pool
    timeout, ``sock_connect`` its connect timeout, ``sock_read`` its read timeout."""
    return aiohttp.ClientTimeout(total=None, connect=pool, sock_connect=connect, sock_read=read)


def _raise_mapped(exc: BaseException, sent: bool, request: Optional[httpx.Request] = None) -> NoReturn:
    """Raise the httpx exception of an aiohttp one, by whether the request may
    have left (see the module doc); ``sent``: the answer's head had arrived."""
    if isinstance(exc, aiohttp.ConnectionTimeoutError):  # sock_connect, or waiting for the pool (connect)
        raise httpx.ConnectTimeout(str(exc) or "connect timeout", request=request) from exc
    if isinstance(exc, aiohttp.ClientConnectorError):  # refused, DNS, TLS handshake
        raise httpx.ConnectError(str(exc), request=request) from exc
    if isinstance(exc, (aiohttp.ServerTimeoutError, asyncio.TimeoutError)):  # read timeout: it may have been sent
        raise httpx.ReadTimeout(str(exc) or "read timeout", request=request) from exc
    if isinstance(exc, aiohttp.ClientPayloadError):
        raise httpx.ReadError(str(exc), request=request) from exc
    if isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, aiohttp.ClientResponseError)):
        # the connection dropped after the request started, or the answer was not HTTP
        raise httpx.RemoteProtocolError(str(exc) or type(exc).__name__, request=request) from exc
    if sent:
        raise httpx.ReadError(str(exc), request=request) from exc
    raise httpx.ConnectError(str(exc), request=request) from exc


class Answer:
    """An answer read whole, as :meth:`AiohttpTransport.send` returns it: what the
    adapters read of an ``httpx.Response`` (``status_code``, ``content``,
    ``json()``, ``headers``, ``text``, ``reason_phrase``), with httpx's semantics
    (the headers an ``httpx.Headers``: case-insensitive, repeated values joined;
    ``text`` decoded by the Content-Type's charset, else UTF-8, errors replaced),
    without building httpx's models unless a field that needs them is read."""

    __slots__ = ("status_code", "content", "_raw", "_reason", "_headers")

    def __init__(self, status: int, raw_headers: Any, content: bytes, reason: Optional[str] = None) -> None:
        self.status_code = status
        self.content = content
        self._raw = raw_headers  #: [(name bytes, value bytes)], as received
        self._reason = reason
        self._headers: Optional[httpx.Headers] = None

    @property
    def headers(self) -> httpx.Headers:
        if self._headers is None:
            self._headers = httpx.Headers(list(self._raw))
        return self._headers

    @property
    def reason_phrase(self) -> str:
        # as httpx read it from the transport's extensions: ASCII, the rest dropped
        return (self._reason or "").encode(errors="surrogateescape").decode("ascii", errors="ignore")

    @property
    def is_success(self) -> bool:
        return 200 <= self.status_code < 300

    @property
    def encoding(self) -> str:
        charset = _charset(self.headers.get("content-type"))
        if charset is not None:
            try:
                codecs.lookup(charset)
                return charset
            except LookupError:
                pass
        return "utf-8"

    @property
    def text(self) -> str:
        if not self.content:
            return ""
        decoder = codecs.getincrementaldecoder(self.encoding)(errors="replace")  # httpx's TextDecoder
        return decoder.decode(self.content, final=True)

    def json(self, **kwargs: Any) -> Any:
        return json.loads(self.content, **kwargs)

    def __repr__(self) -> str:
        return f"<Answer [{self.status_code} {self.reason_phrase}]>"


def _charset(content_type: Optional[str]) -> Optional[str]:
    if not content_type:
        return None
    msg = email.message.Message()  # as httpx parses it
    msg["content-type"] = content_type
    return msg.get_content_charset(failobj=None)
