"""Producer status callbacks on the wire: one signed JSON POST (agents/callbacks.py
decides what and when; pipeline/rules/callbacks.py the body).

Signed the Standard Webhooks way with the webhook channel's own signer
(adapters/webhook.py :func:`~adapters.webhook.sign`): ``webhook-id`` (the POST's
message id, the same for every retry of the same changes), ``webhook-timestamp``
(unix seconds of this try) and ``webhook-signature: v1,<base64 HMAC-SHA256 of
"<id>.<timestamp>.<body>">``, one ``v1,`` signature per secret of the producer,
space-separated (every key of a producer has its own ``whsec_`` secret, so a
producer rotating keys verifies with either: the ``standardwebhooks`` libraries
accept a header holding several).

The target guard is the webhook channel's (:class:`~adapters.webhook.TargetGuard`):
every address the host resolves to must be public, unless ``allow`` names it,
and the connection is pinned to the checked address (``Host`` and TLS SNI keep
the name), so a DNS answer that changes between check and connect cannot point
the POST inside our network. Redirects are not followed.

Answers: 2xx → delivered; ``410 Gone`` → given up (the producer turned the
endpoint off); a URL the guard refuses or that cannot be called → given up;
anything else (connection refused, timeouts, 3xx, 4xx, 5xx) → tried again later,
``Retry-After`` honoured: a producer's receiver that is down, or misconfigured
for a while, gets every change once it answers 2xx.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence
from urllib.parse import urlsplit, urlunsplit

import httpx

from ._http import make_client
from .base import parse_retry_after
from .webhook import BadAddress, TargetGuard, TargetRefused, sign

__all__ = ["CallbackSender", "PostResult", "signature_headers"]


@dataclass(frozen=True)
class PostResult:
    ok: bool
    permanent: bool = False
    error: str = ""
    status: Optional[int] = None
    retry_after: Optional[float] = None


def signature_headers(secrets: Sequence[str | bytes], msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The Standard Webhooks headers of ``body``, signed under every secret."""
    if not secrets:
        raise ValueError("no secret to sign with")
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(timestamp)),
        "webhook-signature": " ".join(sign(s, msg_id, int(timestamp), body) for s in secrets),
    }


class CallbackSender:
    """POSTs callbacks through one pooled client, behind the target guard."""

    def __init__(self, *, allow: Sequence[str] = (), timeout: float = 10.0, connect_timeout: float = 5.0,
                 max_connections: int = 64, resolve: Optional[Callable[[str, int], Any]] = None,
                 client: Optional[httpx.AsyncClient] = None, clock: Callable[[], float] = time.time,
                 user_agent: str = "notify-stream-callbacks/1") -> None:
        self.guard = TargetGuard(tuple(allow), **({"resolve": resolve} if resolve else {}))
        self._clock = clock
        self._client = client or make_client(timeout=timeout, connect_timeout=min(connect_timeout, timeout),
                                             max_connections=max_connections,
                                             headers={"user-agent": user_agent})

    async def post(self, url: str, msg_id: str, body: bytes, secrets: Sequence[str | bytes]) -> PostResult:
        try:
            scheme, host, port, ip = await self.guard.check(url)
        except BadAddress as exc:
            return PostResult(False, permanent=True, error=f"bad_address: {exc}"[:300])
        except TargetRefused as exc:
            return PostResult(False, permanent=True, error=f"target_refused: {exc}"[:300])
        except (OSError, UnicodeError) as exc:  # DNS: may be transient
            return PostResult(False, error=f"resolve: {exc}"[:300])
        parts = urlsplit(url)
        netloc_ip = f"[{ip}]" if ":" in ip else ip
        default_port = 443 if scheme == "https" else 80
        pinned = urlunsplit((scheme, netloc_ip if port == default_port else f"{netloc_ip}:{port}",
                             parts.path or "/", parts.query, ""))
        headers = {"content-type": "application/json",
                   **signature_headers(secrets, msg_id, int(self._clock()), body),
                   "host": host if port == default_port else f"{host}:{port}"}
        extensions = {"sni_hostname": host} if scheme == "https" else {}
        try:
            resp = await self._client.post(pinned, content=body, headers=headers, extensions=extensions)
        except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
            return PostResult(False, permanent=True, error=f"bad_address: {exc}"[:300])
        except Exception as exc:  # noqa: BLE001 - refused, timed out, dropped: try again later
            return PostResult(False, error=f"{type(exc).__name__}: {exc}"[:300])
        status = resp.status_code
        if 200 <= status < 300:
            return PostResult(True, status=status)
        error = f"{status} {resp.reason_phrase}".strip()
        if status == 410:
            return PostResult(False, permanent=True, error=f"gone: {error}", status=status)
        return PostResult(False, error=error, status=status, retry_after=parse_retry_after(resp.headers.get("retry-after")))

    async def close(self) -> None:
        await self._client.aclose()
