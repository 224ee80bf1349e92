"""Outgoing webhooks: JSON POSTs to a URL the customer registered, signed the
Standard Webhooks way (https://www.standardwebhooks.com), so a receiver
verifies them with the ``standardwebhooks`` library of its language (the test
suite uses the Python one as the judge).

Request: ``POST <url>`` with the JSON body and headers

* ``webhook-id``: the delivery id (receivers de-duplicate on it; a resend
  after TIMEOUT_UNKNOWN carries the same id),
* ``webhook-timestamp``: unix seconds,
* ``webhook-signature: v1,<base64 HMAC-SHA256(key, "<id>.<timestamp>.<body>")>``
  (space-separated when several, e.g. during a secret rotation); the id is
  signed, so a captured request replayed under another id does not verify.

The secret is ``whsec_<base64 of the key>`` (:func:`new_secret`; raw ``bytes``
are taken as the key itself). Receivers check the signature and refuse
timestamps more than 5 minutes away (:func:`verify`).

The body: a webhook template renders ``body`` as JSON *text*
(:mod:`pipeline.templates`), which is sent as the JSON it is, never encoded a
second time (a receiver gets ``{"type": …}``, not the string
``"{\"type\": …}"``); a ``body`` that is already an object is encoded once;
content without ``body`` is sent whole. A text that is not JSON is refused
without a call: PERMANENT_ERROR ``invalid_request``, ``bad_webhook_json:
template <code>: …`` (:func:`payload`).

Answers: 2xx → ACCEPTED; 410 → PERMANENT_ERROR ``gone`` (the receiver
unsubscribed); 429 → RATE_LIMITED (Retry-After); 408/425/5xx →
TRANSIENT_ERROR; any other 3xx/4xx → PERMANENT_ERROR ``rejected`` (redirects
are not followed: a redirect could point inside our network).

Target guard (SSRF): the host is resolved with ``getaddrinfo`` and *every*
address must be public (not private, loopback, link-local, multicast,
reserved, unspecified, shared/CGNAT, site-local, or a disguise of one:
IPv4-mapped, 6to4, Teredo, NAT64 ``64:ff9b::/96``), unless
``allow`` names it. Every spelling of an address is resolved to the same IP
first (``localhost`` and names from /etc/hosts, ``2130706433``, ``0177.0.0.1``,
``0x7f.1``, ``[::ffff:127.0.0.1]`` … all end up as the address the system
resolver gives), so the check is on the IP, never on the spelling. Otherwise →
PERMANENT_ERROR ``target_refused``. The connection is then pinned to the
checked address (``Host`` header and TLS SNI keep the name), so a DNS answer
that changes between check and connect (DNS rebinding) cannot redirect the
request. An address that is not a URL we can call at all (whitespace or a
control character in it, a host that is not a host name) → PERMANENT_ERROR
``bad_address``, never a retry.

``allow`` entries: a host name (``hooks.internal``: trusted whatever it
resolves to), a CIDR or an address (``10.1.0.0/16``, ``127.0.0.1``: any port),
or an *endpoint*, an address with a port (``127.0.0.1:8123``, ``[::1]:8123``:
that port of that address only, the URL's port must be it). The provider
simulators' receiver is allowed as its endpoint only, so in the default setup
(``notify run`` with the simulators) a user's webhook URL can reach the
simulator and no other port of this machine: not the broker, not the API, not
the other simulators' control endpoints. A developer testing a receiver on
this machine allows it explicitly: ``WebhookConfig(allow=("127.0.0.1:9000",))``
(``allow = "127.0.0.1:9000"`` in a provider's plain config;
``NOTIFY_WEBHOOK_ALLOW=127.0.0.1:9000`` for the simulators' setup).

Webhooks have no status query: :meth:`query` answers ``supported=False``.

Transport: a send goes straight through the aiohttp session of the adapter's
client (:meth:`adapters._http.Direct.send`), the same request as through
``httpx.AsyncClient`` (its default headers and the configured ``user_agent``, the
URL as httpx parses it, redirects not followed); a client given to the
constructor is used as it is.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import ipaddress
import secrets
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, Union
from urllib.parse import urlsplit, urlunsplit

import httpx
import orjson

from pipeline.models import AttemptResult, Delivery

from ._http import Direct, Reply, exception_result, http1_transport, make_client
from .base import PermanentKind, Provider, SendResult, Stopwatch, header, parse_retry_after

__all__ = [
    "WebhookConfig",
    "WebhookProvider",
    "TargetGuard",
    "TargetRefused",
    "BadAddress",
    "BadPayload",
    "new_secret",
    "signing_key",
    "sign",
    "signed_headers",
    "verify",
    "payload",
    "endpoint_of",
    "allowlist",
]

IPAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
_SHARED = ipaddress.ip_network("100.64.0.0/10")  # CGNAT (RFC 6598)
SECRET_PREFIX = "whsec_"
#: receivers refuse timestamps further than this from their clock (Standard Webhooks: 5 min)
TOLERANCE_S = 300


# ---------------------------------------------------------------- Standard Webhooks


def new_secret(nbytes: int = 32) -> str:
    """A fresh secret in the Standard Webhooks format, ``whsec_<base64>``."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(nbytes)).decode()


def signing_key(secret: str | bytes) -> bytes:
    """The HMAC key of a secret: ``whsec_<base64>`` (the prefix is optional, as
    the libraries take it) decoded; ``bytes`` are the key. Raises ``ValueError``
    for a string that is not base64 or an empty key."""
    if isinstance(secret, (bytes, bytearray)):
        key = bytes(secret)
    else:
        text = secret[len(SECRET_PREFIX):] if secret.startswith(SECRET_PREFIX) else secret
        try:
            key = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("a webhook secret is whsec_<base64> (or the key as bytes)") from None
    if not key:
        raise ValueError("a webhook secret may not be empty")
    return key


def sign(secret: str | bytes, msg_id: str, timestamp: int | str, body: bytes) -> str:
    """``v1,<base64 HMAC-SHA256(key, "<msg_id>.<timestamp>.<body>")>``."""
    mac = hmac.new(signing_key(secret), f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256)
    return "v1," + base64.b64encode(mac.digest()).decode()


def signed_headers(secret: str | bytes, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three Standard Webhooks headers for ``body``."""
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(timestamp)),
        "webhook-signature": sign(secret, msg_id, int(timestamp), body),
    }


def verify(
    secret: str | bytes | Sequence[str | bytes],
    body: bytes,
    headers: Mapping[str, str],
    now: Optional[float] = None,
    tolerance: float = TOLERANCE_S,
) -> bool:
    """What a Standard Webhooks receiver checks: the three headers are there,
    the timestamp is within ``tolerance`` seconds of ``now``, and one of the
    space-separated ``v1,`` signatures is the HMAC of ``id.timestamp.body``
    under one of the secrets. Constant-time comparison."""
    msg_id, ts, sigs = (header(headers, n) for n in ("webhook-id", "webhook-timestamp", "webhook-signature"))
    if not (msg_id and ts and sigs):
        return False
    try:
        t = int(ts.strip())
    except ValueError:
        return False
    now = time.time() if now is None else now
    if abs(now - t) > tolerance:
        return False
    keys = [secret] if isinstance(secret, (str, bytes, bytearray)) else list(secret)
    ok = False
    for key in keys:
        try:
            expected = sign(key, msg_id, t, body).encode()
        except ValueError:
            continue
        for given in sigs.split(" "):
            if given and hmac.compare_digest(given.encode(), expected):
                ok = True
    return ok


class BadPayload(ValueError):
    """The delivery's webhook body is not JSON."""


def payload(delivery: Delivery) -> bytes:
    """The JSON body of a webhook delivery: the rendered JSON text of
    ``content["body"]`` as the JSON it is (parsed once, to check it), an object
    encoded once, or the whole content when it has no ``body``. Raises
    :class:`BadPayload` (naming the template) when the text is not JSON."""
    content = delivery.content or {}
    body = content["body"] if "body" in content else content
    if isinstance(body, (str, bytes)):
        try:
            return orjson.dumps(orjson.loads(body))
        except orjson.JSONDecodeError as exc:
            raise BadPayload(f"bad_webhook_json: template {delivery.template}: {exc}") from None
    return orjson.dumps(body)


# ---------------------------------------------------------------- target guard


class TargetRefused(Exception):
    """The webhook URL points somewhere we refuse to call."""


class BadAddress(ValueError):
    """The webhook URL is not a URL we can call at all (a permanent failure)."""


_NAT64 = ipaddress.ip_network("64:ff9b::/96")  # RFC 6052: the last 32 bits are an IPv4 address


def _unwrap(ip: IPAddress) -> IPAddress:
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if ip.sixtofour is not None:
            return ip.sixtofour
        if ip.teredo is not None:
            return ip.teredo[1]
        if ip in _NAT64:
            return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
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


def _endpoint(entry: str) -> Optional[tuple[IPAddress, int]]:
    """``"127.0.0.1:8123"`` / ``"[::1]:8123"`` → (address, port); None for anything else."""
    if entry.startswith("["):
        addr, sep, port = entry[1:].partition("]:")
    elif entry.count(":") == 1:
        addr, sep, port = entry.partition(":")
    else:
        return None
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    try:
        return ipaddress.ip_address(addr), int(port)
    except ValueError:
        return None


def _host_of(parts: Any) -> str:
    """The URL's host, lower case, no trailing dot; BadAddress when it is no host
    we could resolve (empty, whitespace or a control character, not IDNA-encodable)."""
    host = (parts.hostname or "").lower().rstrip(".")
    if not host:
        raise BadAddress("no host")
    if any(c.isspace() or ord(c) < 32 or 127 <= ord(c) < 160 for c in host):
        raise BadAddress("a control character or a space in the host")
    if not host.startswith("[") and ":" not in host:
        try:
            host.encode("idna")
        except UnicodeError as exc:
            raise BadAddress(f"not a host name: {exc}") from None
    return host


@dataclass
class TargetGuard:
    """Decides whether a URL may be called. ``allow`` holds host names, CIDRs /
    addresses (any port) and endpoints (``"127.0.0.1:8123"``, ``"[::1]:8123"``:
    that port only); see the module doc."""

    allow: Sequence[str] = ()
    resolve: Callable[[str, int], Any] = _default_resolve
    _hosts: set[str] = field(init=False, default_factory=set)
    _nets: list[Any] = field(init=False, default_factory=list)
    _endpoints: set[tuple[Any, int]] = field(init=False, default_factory=set)

    def __post_init__(self) -> None:
        self.allow = tuple(self.allow)
        self._add(self.allow)

    def _add(self, entries: Iterable[str]) -> None:
        for entry in entries:
            entry = entry.strip()
            if not entry:
                continue
            ep = _endpoint(entry)
            if ep is not None:
                self._endpoints.add(ep)
                continue
            try:
                self._nets.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
            except ValueError:
                self._hosts.add(entry.lower().rstrip("."))

    def extend(self, entries: Iterable[str]) -> None:
        """Allow these entries too (an operator's explicit opt-in)."""
        entries = tuple(e.strip() for e in entries if e.strip())
        self.allow = tuple(self.allow) + entries
        self._add(entries)

    def _allowed(self, ip: IPAddress, port: int) -> bool:
        return (ip, port) in self._endpoints or any(ip.version == n.version and ip in n for n in self._nets)

    async def check(self, url: str) -> tuple[str, str, int, str]:
        """→ (scheme, host, port, pinned ip). Raises :class:`TargetRefused`, or
        :class:`BadAddress` for a URL that cannot be called at all; resolver errors
        (``OSError``) propagate (a DNS failure may be transient)."""
        if not isinstance(url, str) or any(c.isspace() or ord(c) < 32 or 127 <= ord(c) < 160 for c in url):
            raise BadAddress("a space or a control character in the URL")
        try:
            parts = urlsplit(url)
            scheme = parts.scheme.lower()
            if scheme not in ("http", "https"):
                raise TargetRefused(f"scheme {scheme!r} not allowed")
            host = _host_of(parts)
            if parts.username or parts.password:
                raise TargetRefused("credentials in URL")
            port = parts.port or (443 if scheme == "https" else 80)
        except ValueError as exc:  # urlsplit: a bad IPv6 literal; .port: not a port
            if isinstance(exc, BadAddress):
                raise
            raise BadAddress(f"not a URL: {exc}") from None
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
            if not self._allowed(ip, port) and is_forbidden_address(ip):
                raise TargetRefused(f"{host} (port {port}) resolves to {ip}, a non-public address")
        return scheme, host, port, str(ips[0])


# ---------------------------------------------------------------- provider


@dataclass
class WebhookConfig:
    secret: str | bytes  #: ``whsec_<base64>`` (Standard Webhooks), or the key as bytes
    allow: Sequence[str] = ()  #: hosts, CIDRs, address:port endpoints exempt from the target guard
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
        signing_key(config.secret)  # a malformed secret fails here, not on every send
        self.guard = TargetGuard(config.allow, **({"resolve": resolve} if resolve else {}))
        #: sends, straight through the client's transport (None: through the client given)
        self._direct: Optional[Direct] = None
        if client is None:
            transport = http1_transport(config)
            client = make_client(
                timeout=config.timeout,
                connect_timeout=config.connect_timeout,
                verify=config.verify,
                max_connections=config.max_connections,
                headers={"user-agent": config.user_agent},
                transport=transport,
            )
            self._direct = Direct.of(client, transport)
        self._client = client

    @staticmethod
    def payload(delivery: Delivery) -> bytes:
        return payload(delivery)

    def signed_headers(self, delivery: Delivery, body: bytes) -> dict[str, str]:
        return {
            "content-type": "application/json",
            **signed_headers(self.config.secret, delivery.delivery_id, int(self._clock()), body),
            "x-notify-category": delivery.category or "",
        }

    async def send(self, delivery: Delivery) -> SendResult:
        sw = Stopwatch()
        url = delivery.address
        try:
            body = self.payload(delivery)
        except BadPayload as exc:
            return SendResult(AttemptResult.PERMANENT_ERROR, self.name, error=str(exc)[:300],
                              permanent_kind=PermanentKind.INVALID_REQUEST, latency_ms=sw.ms)
        try:
            scheme, host, port, ip = await self.guard.check(url)
        except BadAddress as exc:
            return SendResult(AttemptResult.PERMANENT_ERROR, self.name, error=f"bad_address: {exc}"[:300],
                              permanent_kind=PermanentKind.BAD_ADDRESS, latency_ms=sw.ms)
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
        headers = self.signed_headers(delivery, body)
        parts = urlsplit(url)
        netloc_ip = f"[{ip}]" if ":" in ip else ip
        default_port = 443 if scheme == "https" else 80
        pinned = urlunsplit((scheme, netloc_ip if port == default_port else f"{netloc_ip}:{port}", parts.path or "/", parts.query, ""))
        headers["host"] = host if port == default_port else f"{host}:{port}"
        extensions = {"sni_hostname": host} if scheme == "https" else {}
        try:
            if self._direct is not None:  # the URL as the client would have parsed it (or refused it)
                resp: Reply = await self._direct.send("POST", str(httpx.URL(pinned)), headers.items(), body,
                                                      extensions.get("sni_hostname"))
            else:
                resp = await self._client.post(pinned, content=body, headers=headers, extensions=extensions)
        except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:  # refused before anything left
            return SendResult(AttemptResult.PERMANENT_ERROR, self.name, error=f"bad_address: {exc}"[:300],
                              permanent_kind=PermanentKind.BAD_ADDRESS, latency_ms=sw.ms)
        except Exception as exc:  # noqa: BLE001
            return exception_result(self.name, exc, sw.ms)
        return self._map(resp, delivery.delivery_id, sw.ms)

    def _map(self, resp: Reply, delivery_id: str, latency_ms: float) -> SendResult:
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


def endpoint_of(url: str) -> str:
    """The allowlist entry of exactly the receiver at ``url``: its address and
    port (``"127.0.0.1:8123"``, ``"[::1]:8123"``), e.g. the simulators' receiver."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def allowlist(entries: Iterable[str]) -> tuple[str, ...]:
    """Normalise an allowlist from config (comma-separated strings welcome)."""
    out: list[str] = []
    for e in entries:
        out.extend(x.strip() for x in e.split(",") if x.strip())
    return tuple(out)
