"""Shared httpx plumbing for the HTTP adapters: client construction and the
mapping of transport exceptions to attempt results (see :mod:`adapters.base`)."""

from __future__ import annotations

from typing import Any, Optional

import httpx

from pipeline.models import AttemptResult

from ._aiohttp import AiohttpTransport
from .base import QueryResult, QueryStatus, SendResult

__all__ = ["make_client", "exception_result", "query_error", "response_json"]


def make_client(
    base_url: str = "",
    *,
    timeout: float,
    connect_timeout: float,
    http2: bool = False,
    verify: Any = True,
    max_connections: int = 100,
    headers: Optional[dict[str, str]] = None,
) -> httpx.AsyncClient:
    """One pooled client per provider. ``http2=True`` means HTTP/2 only: ALPN h2
    over TLS, prior knowledge (h2c) over cleartext ``http://`` (simulators)."""
    kwargs: dict[str, Any] = {}
    if http2:
        kwargs.update(http1=False, http2=True)
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
