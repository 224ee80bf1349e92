"""Outgoing webhooks: signed JSON POSTs to a URL the customer registered.

Request: ``POST <url>`` with the JSON body ``content["body"]`` (or the whole
content when it has no ``body`` key) and headers

* ``X-Notify-Id``: the delivery id (receivers de-duplicate on it; a resend
  after TIMEOUT_UNKNOWN carries the same id),
* ``X-Notify-Timestamp``: unix seconds,
* ``X-Notify-Signature: sha256=<hex HMAC-SHA256(secret, "<timestamp>.<body>")>``;
  receivers check it with :func:`verify_signature` (or its equivalent) and
  reject timestamps older than 5 minutes (replays).

Answers: 2xx → ACCEPTED; 410 → PERMANENT_ERROR ``gone`` (the receiver
unsubscribed); 429 → RATE_LIMITED (Retry-After); 408/425/5xx →
TRANSIENT_ERROR; any other 3xx/4xx → PERMANENT_ERROR ``rejected`` (redirects
are not followed: a redirect could point inside our network).

Target guard (SSRF): the host is resolved with ``getaddrinfo`` and *every*
address must be public (not private, loopback, link-local, multicast,
reserved, unspecified, shared/CGNAT, site-local, or an IPv4-mapped/6to4
disguise of one), unless the host name or a CIDR containing the address is in
``allow``. Otherwise → PERMANENT_ERROR ``target_refused``. The connection is
then pinned to the checked address (``Host`` header and TLS SNI keep the
name), so a DNS answer that changes between check and connect (DNS
rebinding) cannot redirect the request.

Webhooks have no status query: :meth:`query` answers ``supported=False``.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Sequence, Union
from urllib.parse import urlsplit, urlunsplit

import httpx
import orjson

from pipeline.models import AttemptResult, Delivery

from ._http import exception_result, make_client
from .base import PermanentKind, Provider, SendResult, Stopwatch, parse_retry_after

__all__ = [
    "WebhookConfig",
    "WebhookProvider",
    "TargetGuard",
    "TargetRefused",
    "sign",
    "signature_header",
    "verify_signature",
]

IPAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
_SHARED = ipaddress.ip_network("100.64.0.0/10")  # CGNAT (RFC 6598)


def sign(secret: str | bytes, timestamp: int | str, body: bytes) -> str:
    """Hex HMAC-SHA256 over ``b"<timestamp>." + body``."""
    key = secret.encode() if isinstance(secret, str) else secret
    return hmac.new(key, str(timestamp).encode() + b"." + body, hashlib.sha256).hexdigest()


def signature_header(secret: str | bytes, timestamp: int | str, body: bytes) -> str:
    return "sha256=" + sign(secret, timestamp, body)


def verify_signature(
    secret: str | bytes,
    timestamp: str | int | None,
    body: bytes,
    header: Optional[str],
    now: Optional[float] = None,
    tolerance: float = 300,
) -> bool:
    """Check ``X-Notify-Signature`` (``sha256=<hex>``, several comma-separated
    values allowed during secret rotation) and that ``timestamp`` is within
    ``tolerance`` seconds of ``now``. Constant-time comparison."""
    if not header or timestamp is None:
        return False
    try:
        ts = int(str(timestamp).strip())
    except ValueError:
        return False
    now = time.time() if now is None else now
    if abs(now - ts) > tolerance:
        return False
    expected = sign(secret, ts, body)
    ok = False
    for part in header.split(","):
        scheme, _, value = part.strip().partition("=")
        if scheme == "sha256" and hmac.compare_digest(value.strip().lower(), expected):
            ok = True
    return ok


# ---------------------------------------------------------------- target guard


class TargetRefused(Exception):
    """The webhook URL points somewhere we refuse to call."""


def _unwrap(ip: IPAddress) -> IPAddress:
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if ip.sixtofour is not None:
            return ip.sixtofour
        if ip.teredo is not None:
            return ip.teredo[1]
    return ip


def is_forbidden_address(ip: IPAddress) -> bool:
    """True for anything that is not a plain public unicast address."""
    for a in {ip, _unwrap(ip)}:
        if (
            a.is_private
            or a.is_loopback
            or a.is_link_local
            or a.is_multicast
            or a.is_reserved
            or a.is_unspecified
            or not a.is_global
            or (isinstance(a, ipaddress.IPv4Address) and a in _SHARED)
            or (isinstance(a, ipaddress.IPv6Address) and a.is_site_local)
        ):
            return True
    return False


Resolver = Callable[[str, int], "asyncio.Future[list[str]] | Any"]


async def _default_resolve(host: str, port: int) -> list[str]:
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [info[4][0] for info in infos]


@dataclass
class TargetGuard:
    """Decides whether a URL may be called. ``allow`` holds host names and/or
    CIDRs (``"127.0.0.1"``, ``"10.1.0.0/16"``, ``"hooks.internal.example"``)."""

    allow: Sequence[str] = ()
    resolve: Callable[[str, int], Any] = _default_resolve
    _hosts: set[str] = field(init=False, default_factory=set)
    _nets: list[Any] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        for entry in self.allow:
            try:
                self._nets.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                self._hosts.add(entry.lower().rstrip("."))

    def _allowed(self, ip: IPAddress) -> bool:
        return any(ip.version == n.version and ip in n for n in self._nets)

    async def check(self, url: str) -> tuple[str, str, int, str]:
        """→ (scheme, host, port, pinned ip). Raises :class:`TargetRefused`;
        resolver errors (``OSError``) propagate (a DNS failure may be transient)."""
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https"):
            raise TargetRefused(f"scheme {scheme!r} not allowed")
        host = (parts.hostname or "").lower().rstrip(".")
        if not host:
            raise TargetRefused("no host")
        if parts.username or parts.password:
            raise TargetRefused("credentials in URL")
        try:
            port = parts.port or (443 if scheme == "https" else 80)
        except ValueError as exc:
            raise TargetRefused(f"bad port: {exc}") from None
        try:
            literal: Optional[IPAddress] = ipaddress.ip_address(host)
        except ValueError:
            literal = None
        if literal is not None:
            addrs = [str(literal)]
        else:
            addrs = list(await self.resolve(host, port))
            if not addrs:
                raise OSError(f"{host}: no address")
        if host in self._hosts:
            return scheme, host, port, addrs[0]
        ips = [ipaddress.ip_address(a.split("%", 1)[0]) for a in addrs]
        for ip in ips:
            if not self._allowed(ip) and is_forbidden_address(ip):
                raise TargetRefused(f"{host} resolves to {ip}, a non-public address")
        return scheme, host, port, str(ips[0])


# ---------------------------------------------------------------- provider


@dataclass
class WebhookConfig:
    secret: str | bytes
    allow: Sequence[str] = ()  #: hosts / CIDRs exempt from the target guard
    timeout: float = 10.0
    connect_timeout: float = 5.0
    user_agent: str = "notify-stream-webhooks/1"
    verify: Any = True
    max_connections: int = 100
    name: str = "webhook"


class WebhookProvider(Provider):
    channel = "webhook"

    def __init__(
        self,
        config: WebhookConfig,
        *,
        clock: Callable[[], float] = time.time,
        resolve: Optional[Callable[[str, int], Any]] = None,
        client: Optional[httpx.AsyncClient] = None,
    ) -> None:
        self.config = config
        self.name = config.name
        self._clock = clock
        self.guard = TargetGuard(config.allow, **({"resolve": resolve} if resolve else {}))
        self._client = client or make_client(
            timeout=config.timeout,
            connect_timeout=config.connect_timeout,
            verify=config.verify,
            max_connections=config.max_connections,
            headers={"user-agent": config.user_agent},
        )

    @staticmethod
    def payload(delivery: Delivery) -> bytes:
        content = delivery.content or {}
        body = content["body"] if "body" in content else content
        return orjson.dumps(body)

    def signed_headers(self, delivery: Delivery, body: bytes) -> dict[str, str]:
        ts = int(self._clock())
        return {
            "content-type": "application/json",
            "x-notify-id": delivery.delivery_id,
            "x-notify-timestamp": str(ts),
            "x-notify-signature": signature_header(self.config.secret, ts, body),
            "x-notify-category": delivery.category or "",
        }

    async def send(self, delivery: Delivery) -> SendResult:
        sw = Stopwatch()
        url = delivery.address
        try:
            scheme, host, port, ip = await self.guard.check(url)
        except TargetRefused as exc:
            return SendResult(
                AttemptResult.PERMANENT_ERROR,
                self.name,
                error=f"target_refused: {exc}"[:300],
                permanent_kind=PermanentKind.TARGET_REFUSED,
                latency_ms=sw.ms,
            )
        except (OSError, UnicodeError) as exc:
            return SendResult(AttemptResult.TRANSIENT_ERROR, self.name, error=f"resolve: {exc}"[:300], latency_ms=sw.ms)
        body = self.payload(delivery)
        headers = self.signed_headers(delivery, body)
        parts = urlsplit(url)
        netloc_ip = f"[{ip}]" if ":" in ip else ip
        default_port = 443 if scheme == "https" else 80
        pinned = urlunsplit((scheme, netloc_ip if port == default_port else f"{netloc_ip}:{port}", parts.path or "/", parts.query, ""))
        headers["host"] = host if port == default_port else f"{host}:{port}"
        extensions = {"sni_hostname": host} if scheme == "https" else {}
        try:
            resp = await self._client.post(pinned, content=body, headers=headers, extensions=extensions)
        except Exception as exc:  # noqa: BLE001
            return exception_result(self.name, exc, sw.ms)
        return self._map(resp, delivery.delivery_id, sw.ms)

    def _map(self, resp: httpx.Response, delivery_id: str, latency_ms: float) -> SendResult:
        status = resp.status_code
        if 200 <= status < 300:
            return SendResult(AttemptResult.ACCEPTED, self.name, provider_msg_id=delivery_id, latency_ms=latency_ms)
        error = f"{status} {resp.reason_phrase}"
        retry_after = parse_retry_after(resp.headers.get("retry-after"))
        if status == 429:
            return SendResult(AttemptResult.RATE_LIMITED, self.name, error=error, retry_after=retry_after, latency_ms=latency_ms)
        if status >= 500 or status in (408, 425):
            return SendResult(AttemptResult.TRANSIENT_ERROR, self.name, error=error, retry_after=retry_after, latency_ms=latency_ms)
        kind = PermanentKind.GONE if status == 410 else PermanentKind.REJECTED
        return SendResult(AttemptResult.PERMANENT_ERROR, self.name, error=error, permanent_kind=kind, latency_ms=latency_ms)

    async def close(self) -> None:
        await self._client.aclose()


def allowlist(entries: Iterable[str]) -> tuple[str, ...]:
    """Normalise an allowlist from config (comma-separated strings welcome)."""
    out: list[str] = []
    for e in entries:
        out.extend(x.strip() for x in e.split(",") if x.strip())
    return tuple(out)
