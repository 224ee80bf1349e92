"""Shared httpx plumbing for the HTTP adapters: client construction (from a
provider config: :func:`client_for`), one timed call mapped to a SendResult
(:func:`timed_send`) and the mapping of transport exceptions to attempt results
(see :mod:`adapters.base`)."""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Optional

import httpx

from pipeline.models import AttemptResult

from ._aiohttp import AiohttpTransport
from ._h2 import H2Transport
from .base import QueryResult, QueryStatus, SendResult, Stopwatch

__all__ = ["make_client", "client_for", "timed_send", "exception_result", "query_error", "response_json"]


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


async def timed_send(
    provider: str,
    call: Callable[[], Awaitable[httpx.Response]],
    to_result: Callable[[httpx.Response, float], SendResult],
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


def response_json(resp: httpx.Response) -> dict[str, Any]:
    """The response body as a dict, ``{}`` when it is not a JSON object."""
    try:
        data = resp.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}
