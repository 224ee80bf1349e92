"""API keys: one or more per producer, each with scopes, stored hashed.

Keys look like ``nfk_<id>_<secret>`` (``id``: 12 hex digits, public, names the
key in logs and in the file; ``secret``: 32 random bytes, base64url). The key
file (default ``<data_dir>/api_keys.json``, mode 0600) keeps, per id, the
producer, the scopes, a random 16-byte salt and ``sha256(salt + secret)``; the
secret itself is shown once, by ``notify keys add``, and never stored. A fast
salted hash is enough because the secrets are random (256 bits), not passwords.

A request sends ``Authorization: Bearer <key>``. Verification always computes
one hash and compares with :func:`hmac.compare_digest`, also for an unknown id
or a malformed key, so its timing does not tell which part was wrong.
``NOTIFY_API_KEY`` (or ``bootstrap_key``) is an extra key with every scope,
for the demo and for creating the first real keys; it is kept hashed in memory.

The file is re-read when its mtime/size changes (``notify keys add`` while the
API runs takes effect on the next request).

Each key also holds a status callback secret (``whsec_…``, shown once by
``notify keys add``, kept as it is: it signs) and optionally a default
``callback_url`` (``--callback-url``); the workers read them from this file
(:class:`ProducerCallbacks`, agents/callbacks.py).

Scopes: ``events:write`` (POST /v1/events), ``records:read`` (the key's own
producer's notification records), ``users:read`` (users' inboxes and
preferences), ``users:write`` (preferences, devices, inbox read marks),
``admin`` (every producer's records), ``priority:any`` (an event's own
``priority`` is taken even above its category's ``max_priority``; without it,
it is lowered to that cap: pipeline/rules/priority.py). A business key belongs to its producer:
the same ``biz_key`` from two producers is two events. The bootstrap key is the
operator's (producer ``""``, the key space of events written straight to the
streams). Receipts are authenticated by the providers' signatures,
``/``, ``/healthz``, ``/metrics``, ``/v1/status.json`` and
``/v1/openapi.json`` are open.
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable, Optional

from aiohttp import web

from ..keyfile import (SCOPES, KeyFileError, KeyStore, Principal, ProducerCallbacks, add_key, key_callback,
                       list_keys, revoke_key)
from .errors import api_error

__all__ = [
    "SCOPES",
    "OPEN",
    "SIGNED",
    "Principal",
    "KeyStore",
    "add_key",
    "key_callback",
    "ProducerCallbacks",
    "list_keys",
    "revoke_key",
    "requires",
    "auth_middleware",
    "KeyFileError",
    "PRINCIPAL",
]

log = logging.getLogger("notify.api")

#: marker: no API key needed
OPEN = "open"
#: marker: authenticated by the caller's signature in the handler (receipts)
SIGNED = "signed"

def requires(scope: str, query: Iterable[str] = ()) -> Callable:
    """Mark a handler with the scope it needs (or :data:`OPEN` / :data:`SIGNED`;
    a handler without a mark is refused to every key) and the query parameters
    it takes (any other one is a 400, so a typo such as ``?limt=5`` is not
    silently ignored)."""

    def mark(fn: Callable) -> Callable:
        fn.scope = scope  # type: ignore[attr-defined]
        fn.query = frozenset(query)  # type: ignore[attr-defined]
        return fn

    return mark


#: where the middleware leaves the caller's :class:`Principal`
PRINCIPAL = web.RequestKey("principal", Principal)

_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="notify"'}


def _bearer(request: web.Request) -> Optional[str]:
    header = request.headers.get("Authorization")
    if not header:
        return None
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    value = value.strip()
    return value or None


def _check_query(request: web.Request, allowed: Optional[frozenset[str]]) -> None:
    if allowed is None:
        return
    for name in request.query:
        if name not in allowed:
            hint = f" (known: {', '.join(sorted(allowed))})" if allowed else ""
            raise api_error(400, "unknown_parameter", f"unknown query parameter {name!r}{hint}", field=name)


def auth_middleware(keys: KeyStore):
    @web.middleware
    async def middleware(request: web.Request, handler) -> web.StreamResponse:
        match = request.match_info
        if getattr(match, "http_exception", None) is not None:
            return await handler(request)  # 404 / 405: no such route, nothing to protect
        scope = getattr(match.handler, "scope", None)
        allowed = getattr(match.handler, "query", None)
        if scope in (OPEN, SIGNED):
            _check_query(request, allowed)
            return await handler(request)
        key = _bearer(request)
        if key is None:
            raise api_error(401, "unauthorized", "missing API key: send 'Authorization: Bearer <key>'",
                            headers=_CHALLENGE)
        principal = keys.verify(key)
        if principal is None:
            raise api_error(401, "unauthorized", "invalid API key", headers=_CHALLENGE)
        if scope is None:  # a handler without @requires: closed to every key, never open by mistake
            log.error("%s %s: handler declares no scope (@requires); refused", request.method, request.path)
            raise api_error(403, "forbidden", "this endpoint declares no scope")
        if scope not in principal.scopes:
            raise api_error(403, "forbidden", f"this key lacks the scope {scope!r}", scope=scope)
        request[PRINCIPAL] = principal
        _check_query(request, allowed)
        return await handler(request)

    return middleware
