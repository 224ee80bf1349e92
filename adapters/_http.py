"""Shared httpx plumbing for the HTTP adapters: client construction (from a
provider config: :func:`client_for`), one timed call mapped to a SendResult
(:func:`timed_send`) and the mapping of transport exceptions to attempt results
(see :mod:`adapters.base`).

The HTTP/1.1 adapters send without httpx's client layers (:class:`Direct`,
:func:`direct_client`): each request goes straight through the aiohttp session of
the client's :class:`~adapters._aiohttp.AiohttpTransport`, built as the client
would have built it, while the client itself stays for the rest (status queries,
token fetches, credential checks) and shares that session, so one provider still
has one connection pool."""

from __future__ import annotations

import re
from json import dumps as _json_dumps
from typing import Any, Awaitable, Callable, Iterable, Mapping, Optional, Sequence, Union

import httpx
import yarl

from pipeline.models import AttemptResult

from . import _aiohttp
from ._aiohttp import AiohttpTransport, Answer, client_timeout
from ._h2 import H2Transport
from .base import QueryResult, QueryStatus, SendResult, Stopwatch

__all__ = ["make_client", "client_for", "timed_send", "exception_result", "query_error", "response_json", "Direct",
           "Route", "direct_client", "form_body", "json_body", "Reply"]

#: an answer as the adapters read it: httpx's (a client given to the constructor,
#: queries) or the direct path's (:class:`~adapters._aiohttp.Answer`)
Reply = Union[httpx.Response, Answer]


def make_client(
    base_url: str = "",
    *,
    timeout: float,
    connect_timeout: float,
    http2: bool = False,
    verify: Any = True,
    max_connections: int = 100,
    headers: Optional[dict[str, str]] = None,
    transport: Optional[httpx.AsyncBaseTransport] = None,
) -> httpx.AsyncClient:
    """One pooled client per provider. ``http2=True`` means HTTP/2 only: ALPN h2
    over TLS, prior knowledge (h2c) over cleartext ``http://`` (simulators), one
    multiplexed connection per origin (``max_connections`` is then unused).
    ``transport``: the one to send over instead (an adapter that also calls its
    :class:`~adapters._h2.H2Transport` directly)."""
    kwargs: dict[str, Any] = {}
    if transport is not None:
        kwargs["transport"] = transport
    elif http2:  # over h2 on asyncio: a third of httpcore's cost per call (adapters/_h2.py)
        kwargs["transport"] = H2Transport(verify=verify)
    else:  # HTTP/1.1 over aiohttp: a fifth of httpx's own cost per call (adapters/_aiohttp.py)
        kwargs["transport"] = AiohttpTransport(max_connections=max_connections, verify=verify)
    return httpx.AsyncClient(
        base_url=base_url,
        timeout=httpx.Timeout(timeout, connect=connect_timeout, pool=connect_timeout),
        limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        verify=verify,
        follow_redirects=False,
        trust_env=False,
        headers=headers,
        **kwargs,
    )


def http1_transport(config: Any) -> httpx.AsyncBaseTransport:
    """The HTTP/1.1 transport :func:`make_client` would give a client of ``config``
    (``max_connections``, ``verify``)."""
    return AiohttpTransport(max_connections=config.max_connections, verify=config.verify)


def client_for(config: Any, base_url: Optional[str] = None, **kw: Any) -> httpx.AsyncClient:
    """:func:`make_client` from a provider config's ``timeout``, ``connect_timeout``,
    ``verify`` and ``max_connections``, to ``base_url`` (default: the config's
    ``base_url``); ``kw``: ``http2``, ``headers``, ``transport``."""
    return make_client(
        config.base_url if base_url is None else base_url,
        timeout=config.timeout,
        connect_timeout=config.connect_timeout,
        verify=config.verify,
        max_connections=config.max_connections,
        **kw,
    )


def direct_client(config: Any, base_url: Optional[str] = None,
                  **kw: Any) -> tuple[httpx.AsyncClient, Optional["Direct"]]:
    """:func:`client_for` over an HTTP/1.1 transport, and the :class:`Direct` path
    through that transport (None when it is not ours: then everything goes through
    the client)."""
    transport = http1_transport(config)
    client = client_for(config, base_url, transport=transport, **kw)
    return client, Direct.of(client, transport)


def form_body(data: Mapping[str, Any]) -> bytes:
    """A form body as httpx encodes ``data=`` (``application/x-www-form-urlencoded``:
    ``urlencode(..., doseq=True)``), each name and value quoted by :func:`quote_plus`."""
    parts: list[str] = []
    for key, value in data.items():
        name = quote_plus(str(key))
        for item in value if isinstance(value, (list, tuple)) else (value,):
            parts.append(name + "=" + quote_plus("true" if item is True else "false" if item is False
                                                 else "" if item is None else str(item)))
    return "&".join(parts).encode("utf-8")


#: what urllib's ``quote_plus`` leaves alone (its always-safe characters) and the space
_QUOTED = re.compile(r"[^A-Za-z0-9_.~ -]+")


def _percent(match: "re.Match[str]") -> str:
    return "".join(["%%%02X" % b for b in match.group().encode("utf-8")])


def quote_plus(text: str) -> str:
    """``urllib.parse.quote_plus(text)``: the same text (an SMS body quoted there
    took ~60 Python calls, here a few: only a run of characters to quote calls
    back); a lone surrogate raises ``UnicodeEncodeError`` as there."""
    return _QUOTED.sub(_percent, text).replace(" ", "+")


def json_body(obj: Any) -> bytes:
    """A JSON body as httpx encodes ``json=`` (compact, UTF-8, no NaN)."""
    return _json_dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


def _wire(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """Per-call headers as httpx would have sent them: names lower case, names and
    values ASCII (anything else raises UnicodeEncodeError, as httpx's Headers do)."""
    out = []
    for k, v in headers:
        if not (k.isascii() and v.isascii()):
            k.encode("ascii"), v.encode("ascii")
        out.append((k.lower(), v))
    return out


class Direct:
    """An adapter's requests sent straight through the aiohttp session of its
    client's :class:`~adapters._aiohttp.AiohttpTransport`
    (:meth:`~adapters._aiohttp.AiohttpTransport.send`), without httpx.AsyncClient's
    layers, and on the wire as that client sent them: the client's default headers
    (``accept``, ``accept-encoding``, ``connection``, ``user-agent`` and the
    adapter's own), ``host``, the credentials, ``content-length``; its timeouts;
    no redirects followed. What the client's layers did and this does not: cookies
    (none are kept or sent back), event hooks (none set), httpx's INFO log line per
    request."""

    __slots__ = ("client", "transport", "timeout", "defaults")

    def __init__(self, client: httpx.AsyncClient, transport: AiohttpTransport) -> None:
        self.client = client
        self.transport = transport
        t = client.timeout
        self.timeout = client_timeout(t.connect, t.read, t.pool)
        #: the client's default headers, as its requests carried them
        self.defaults: list[tuple[str, str]] = list(client.headers.multi_items())

    @classmethod
    def of(cls, client: httpx.AsyncClient, transport: Any) -> Optional["Direct"]:
        """The direct path through ``transport``, the client's; None unless it is an
        :class:`~adapters._aiohttp.AiohttpTransport` (e.g. the benchmark's httpx
        baseline)."""
        return cls(client, transport) if isinstance(transport, _aiohttp.AiohttpTransport) else None

    def route(self, method: str, url: str, headers: Optional[Mapping[str, str]] = None,
              auth: Optional[httpx.Auth] = None) -> Optional["Route"]:
        """The fixed part of one kind of request (``url`` relative to the client's
        base URL, or absolute), built once by the client itself: its URL, its headers
        but ``content-length`` (the client's defaults, ``headers``, ``auth``'s).
        None when the client refuses to build it (a header that is not ASCII…): the
        adapter then goes through the client, which says why on each call."""
        try:
            req = self.client.build_request(method, url, headers=headers)
            if auth is not None:
                req = next(auth.sync_auth_flow(req))
            fixed = [(k, v) for k, v in req.headers.multi_items() if k != "content-length"]
            text = str(req.url)
            return Route(self, req.method, yarl.URL(text), text, fixed)
        except Exception:  # noqa: BLE001 - the client path reports it per call
            return None

    async def send(self, method: str, url: str, headers: Iterable[tuple[str, str]], body: bytes,
                   server_hostname: Optional[str] = None) -> Answer:
        """One request to an absolute ``url`` (as ``str(httpx.URL(...))`` gives it)
        with the client's default headers and ``headers`` (``host`` among them when
        the URL's is not the one to send)."""
        if self.client.is_closed:  # as httpx says it
            raise RuntimeError("Cannot send a request, as the client has been closed.")
        sent = _wire(headers)
        names = {k for k, _ in sent}
        wire = [h for h in self.defaults if h[0] not in names] + sent
        if body or method in ("POST", "PUT", "PATCH"):
            wire.append(("content-length", str(len(body))))
        return await self.transport.send(method, url, wire, body, self.timeout, server_hostname)


class Route:
    """One kind of request of an adapter (:meth:`Direct.route`): method, URL and the
    headers that do not change, built once; :meth:`send` adds the body, its
    ``content-length`` and the per-call headers (names the fixed ones do not have:
    they are added, never merged)."""

    __slots__ = ("direct", "method", "url", "url_text", "headers")

    def __init__(self, direct: Direct, method: str, url: yarl.URL, url_text: str,
                 headers: list[tuple[str, str]]) -> None:
        self.direct = direct
        self.method = method
        self.url = url
        self.url_text = url_text  #: the URL as httpx sends it (what a signature covers)
        self.headers = headers

    async def send(self, body: bytes, headers: Sequence[tuple[str, str]] = ()) -> Answer:
        d = self.direct
        if d.client.is_closed:  # as httpx says it
            raise RuntimeError("Cannot send a request, as the client has been closed.")
        wire = self.headers + _wire(headers) if headers else self.headers.copy()
        if body or self.method in ("POST", "PUT", "PATCH"):
            wire.append(("content-length", str(len(body))))
        return await d.transport.send(self.method, self.url, wire, body, d.timeout)


async def timed_send(
    provider: str,
    call: Callable[[], Awaitable[Reply]],
    to_result: Callable[[Reply, float], SendResult],
) -> SendResult:
    """Make one provider call and map it: ``to_result(response, latency_ms)``, or
    :func:`exception_result` when the call raised (building the request included)."""
    sw = Stopwatch()
    try:
        resp = await call()
    except Exception as exc:  # noqa: BLE001 - mapped, never raised
        return exception_result(provider, exc, sw.ms)
    return to_result(resp, sw.ms)


def exception_result(provider: str, exc: BaseException, latency_ms: float) -> SendResult:
    """Map an exception raised while calling a provider to a SendResult.

    * the request never left (connect refused/timeout, pool timeout, DNS):
      TRANSIENT_ERROR: safe to resend or fail over;
    * it may have been sent (read/write timeout, connection dropped mid-way):
      TIMEOUT_UNKNOWN: reconcile before any resend, never fail over.
    """
    kind = type(exc).__name__
    if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)):
        return SendResult(AttemptResult.TRANSIENT_ERROR, provider, error=f"connect: {kind}: {exc}"[:300], latency_ms=latency_ms)
    if isinstance(exc, (httpx.ReadTimeout, httpx.WriteTimeout)):
        return SendResult(
            AttemptResult.TIMEOUT_UNKNOWN, provider, error=f"timeout after send: {kind}"[:300], latency_ms=latency_ms
        )
    if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError, httpx.CloseError)):
        return SendResult(
            AttemptResult.TIMEOUT_UNKNOWN,
            provider,
            error=f"connection lost after send: {kind}: {exc}"[:300],
            latency_ms=latency_ms,
        )
    # anything else (UnsupportedProtocol, InvalidURL, a bug before the request left)
    return SendResult(AttemptResult.TRANSIENT_ERROR, provider, error=f"{kind}: {exc}"[:300], latency_ms=latency_ms)


def query_error(provider: str, error: str, provider_msg_id: Optional[str] = None) -> QueryResult:
    return QueryResult(found=False, provider_msg_id=provider_msg_id, status=QueryStatus.ERROR, error=error[:300], provider=provider)


def response_json(resp: Reply) -> dict[str, Any]:
    """The response body as a dict, ``{}`` when it is not a JSON object."""
    try:
        data = resp.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}
