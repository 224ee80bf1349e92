"""Bearer tokens of the push adapters: one cache, with single-flight refresh and
invalidation, and the base of the OAuth adapters, whose calls renew a refused
token once.

:class:`CachedToken` keeps a token until ``early_s`` before it runs out. Its
:meth:`~CachedToken.get` fetches one (``fetch()`` → ``(token, lifetime in
seconds)``) when there is none or it is due, one fetch at a time: concurrent
callers wait for that fetch instead of stampeding (FCM's and Huawei's OAuth
access tokens). :meth:`~CachedToken.invalidate` drops the token only if it is
still the one refused, so a sender refused with a token another sender already
renewed takes the new one. A token minted on the spot (the APNs provider JWT)
uses the same store through :meth:`~CachedToken.current` and
:meth:`~CachedToken.put`, without fetching.

:class:`TokenProvider` is the base of the push adapters (APNs, FCM, Huawei Push
Kit): the config, the clock, the pooled client and the token cache.
:class:`OAuthProvider` is that of the OAuth ones (FCM, Huawei Push Kit): the
cache filled by the subclass's ``_fetch_token``, and
:meth:`~OAuthProvider.post_with_token`, which makes one call with the cached
token and, when the answer refuses that token, invalidates it and calls once
more.
"""

from __future__ import annotations

import asyncio
import functools
import time
from typing import Any, Awaitable, Callable, Optional, Union

import httpx

from pipeline.models import AttemptResult

from ._http import client_for, exception_result
from .base import Provider, SendResult, Stopwatch

__all__ = ["CachedToken", "TokenProvider", "OAuthProvider", "load_private_key"]


@functools.lru_cache(maxsize=16)
def load_private_key(pem: str | bytes) -> Any:
    """A PEM private key without a passphrase, loaded once per process: cryptography
    checks an RSA key as it loads it, about 50 ms of CPU, and the registry's check of
    a configured key (adapters/registry.py) and the adapter that signs with it
    (adapters/fcm.py) both need it loaded. Raises ``ValueError``/``TypeError`` for
    text that is not such a key, as ``load_pem_private_key`` does."""
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    return load_pem_private_key(pem.encode() if isinstance(pem, str) else pem, password=None)


class CachedToken:
    """A bearer token, cached until ``early_s`` before its lifetime runs out."""

    def __init__(self, fetch: Optional[Callable[[], Awaitable[tuple[str, float]]]] = None,
                 clock: Callable[[], float] = time.time, early_s: float = 0.0) -> None:
        self.fetch = fetch
        self.clock = clock
        self.early_s = early_s
        self.value: Optional[str] = None
        self.issued_at: float = 0.0  #: when the token was fetched or minted
        self.expires_at: float = 0.0  #: when it stops being used (``early_s`` before it runs out)
        self.fetches = 0  #: how many times ``fetch`` was called
        self._lock = asyncio.Lock()

    def current(self) -> Optional[str]:
        """The token while it is still to be used, else None."""
        if self.value and self.clock() < self.expires_at:
            return self.value
        return None

    def put(self, value: str, lifetime: float, issued_at: Optional[float] = None) -> str:
        """Keep ``value``, issued at ``issued_at`` (default: now), for ``lifetime``
        seconds less ``early_s``."""
        issued = self.clock() if issued_at is None else issued_at
        self.value = value
        self.issued_at = issued
        self.expires_at = issued + max(0.0, lifetime - self.early_s)
        return value

    def invalidate(self, token: Optional[str] = None) -> None:
        """Drop the cached token (only if it is still ``token``, when given)."""
        if token is None or token == self.value:
            self.value = None

    async def get(self) -> str:
        """The cached token, or a new one from ``fetch`` (whatever it raises is raised).
        One fetch at a time: concurrent callers wait for it."""
        token = self.current()
        if token:
            return token
        async with self._lock:
            token = self.current()
            if token:
                return token
            assert self.fetch is not None, "a CachedToken without fetch is filled with put()"
            self.fetches += 1
            value, lifetime = await self.fetch()
            return self.put(value, lifetime)


class TokenProvider(Provider):
    """A provider whose calls carry a bearer token it caches (``_token``), over one
    pooled client to the config's ``base_url``: HTTP/2 when ``http2`` says so (None:
    as the config's ``http2`` says, HTTP/1.1 without one)."""

    http2: Optional[bool] = None

    def __init__(
        self,
        config: Any,
        *,
        clock: Callable[[], float] = time.time,
        client: Optional[httpx.AsyncClient] = None,
    ) -> None:
        self.config = config
        self.name = config.name
        self._clock = clock
        http2 = self.http2 if self.http2 is not None else getattr(config, "http2", False)
        self._client = client or client_for(config, http2=http2)
        self._token = self._token_cache()

    def _token_cache(self) -> CachedToken:
        """A cache the provider fills itself (:meth:`CachedToken.put`)."""
        return CachedToken(clock=self._clock)

    async def close(self) -> None:
        await self._client.aclose()


class OAuthProvider(TokenProvider):
    """A provider whose calls carry an OAuth access token, cached until the config's
    ``token_refresh_margin`` before ``expires_in`` runs out. Subclasses fetch one
    in ``_fetch_token()`` → ``(access token, expires_in)``."""

    def _token_cache(self) -> CachedToken:
        return CachedToken(self._fetch_token, self._clock, self.config.token_refresh_margin)

    @property
    def token_fetches(self) -> int:
        """How many OAuth token fetches were made."""
        return self._token.fetches

    def invalidate_token(self, token: Optional[str] = None) -> None:
        """Drop the cached token (only if it is still ``token``, when given: a sender
        refused with a token another sender already renewed takes the new one)."""
        self._token.invalidate(token)

    async def access_token(self) -> str:
        """A cached OAuth access token; raises ``httpx.HTTPError`` / ``RuntimeError``.
        One fetch at a time: concurrent senders wait for it instead of stampeding."""
        return await self._token.get()

    async def _fetch_token(self) -> tuple[str, float]:
        raise NotImplementedError

    async def post_with_token(
        self,
        sw: Stopwatch,
        call: Callable[[str], Awaitable[httpx.Response]],
        refused: Callable[[httpx.Response], bool],
    ) -> Union[httpx.Response, SendResult]:
        """``call(bearer)`` with the cached token; an answer that ``refused`` (our token,
        not the message) invalidates that token and calls once more with a new one.

        The answer, or the SendResult of a call that got none: no token could be had
        (TRANSIENT_ERROR ``auth: …``: the message never left) or the call raised
        (:func:`adapters._http.exception_result`)."""
        renewed = False
        while True:
            try:
                bearer = await self.access_token()
            except Exception as exc:  # noqa: BLE001 - the message never left
                return SendResult(AttemptResult.TRANSIENT_ERROR, self.name, error=f"auth: {exc}"[:300],
                                  latency_ms=sw.ms)
            try:
                resp = await call(bearer)
            except Exception as exc:  # noqa: BLE001 - mapped, never raised
                return exception_result(self.name, exc, sw.ms)
            if not renewed and refused(resp):
                renewed = True
                self.invalidate_token(bearer)
                continue
            return resp
