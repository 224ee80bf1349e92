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
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any, AsyncIterator, Optional

import aiohttp
import httpx

__all__ = ["AiohttpTransport"]


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
        ct = aiohttp.ClientTimeout(total=None, connect=timeout.get("pool"), sock_connect=timeout.get("connect"),
                                   sock_read=timeout.get("read"))
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
                return httpx.Response(resp.status, headers=list(resp.raw_headers), stream=_Body(content),
                                      extensions={"http_version": b"HTTP/1.1", "reason_phrase": resp.reason.encode()
                                                  if resp.reason else b""})
        except aiohttp.ConnectionTimeoutError as exc:  # sock_connect, or waiting for the pool (connect)
            raise httpx.ConnectTimeout(str(exc) or "connect timeout", request=request) from exc
        except aiohttp.ClientConnectorError as exc:  # refused, DNS, TLS handshake
            raise httpx.ConnectError(str(exc), request=request) from exc
        except (aiohttp.ServerTimeoutError, asyncio.TimeoutError) as exc:  # read timeout: it may have been sent
            raise httpx.ReadTimeout(str(exc) or "read timeout", request=request) from exc
        except aiohttp.ClientPayloadError as exc:
            raise httpx.ReadError(str(exc), request=request) from exc
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, aiohttp.ClientResponseError) as exc:
            # the connection dropped after the request started, or the answer was not HTTP
            raise httpx.RemoteProtocolError(str(exc) or type(exc).__name__, request=request) from exc
        except aiohttp.ClientError as exc:
            if sent:
                raise httpx.ReadError(str(exc), request=request) from exc
            raise httpx.ConnectError(str(exc), request=request) from exc

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
