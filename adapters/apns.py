"""Apple Push Notification service, HTTP/2 provider API with token-based auth.

Wire protocol (Apple, "Sending notification requests to APNs"):
``POST /3/device/<device token>`` over HTTP/2, JSON payload ``{"aps": {...}}``,
headers ``apns-topic`` (bundle id), ``apns-push-type``, ``apns-priority``
(10 immediate / 5 power-saving), ``apns-id`` (UUID, echoed back),
``apns-expiration`` (epoch seconds), ``apns-collapse-id`` (≤ 64 bytes) and
``authorization: bearer <JWT>``: an ES256 JWT with header ``kid`` (key id) and
claims ``iss`` (team id) and ``iat``. Apple rejects tokens older than one hour
and throttles refreshes more frequent than every 20 minutes, so the token is
cached and renewed after ``token_ttl`` (50 min by default).

Errors come back as ``{"reason": "..."}`` (:func:`apns_outcome`):

* BadDeviceToken (400), Unregistered / ExpiredToken (410): the token is dead →
  PERMANENT_ERROR ``bad_token``. A 410 carries Apple's ``timestamp`` (ms), the
  time APNs learnt the token was no longer valid: it is passed on as
  ``SendResult.unregistered_at`` (seconds), and the device must be removed only
  if it was not registered again after that time.
* DeviceTokenNotForTopic, TopicDisallowed, BadTopic, MissingTopic: our topic
  (bundle id) is wrong, not the device → TRANSIENT_ERROR ``config: …`` with
  ``fault="config"``: the device is kept, the breaker counts it, the dispatcher
  reports it.
* 429 TooManyRequests: too many pushes to *this device token* → RATE_LIMITED
  with ``fault="recipient"`` and ``retry_after`` (Retry-After, else
  ``device_retry_after``): that delivery backs off; the breaker does not count
  it, since the provider is healthy. 429 TooManyProviderTokenUpdates is ours
  (``fault="config"``).
* 403 ExpiredProviderToken / InvalidProviderToken / MissingProviderToken: our
  JWT. The adapter renews it and retries once; concurrent requests refused with
  the same token share one renewal (single flight: the first to see the refusal
  mints, the others take its token), and no token is minted sooner than
  ``token_min_renewal`` (20 min) after the last, as Apple allows; a refusal
  inside that window is TRANSIENT_ERROR ``auth: …`` with ``retry_after`` set to
  when a renewal is allowed.
* 5xx → TRANSIENT_ERROR; any other 4xx → PERMANENT_ERROR ``invalid_request``.

Idempotency: APNs has no idempotency key or status query. We send
``apns-id = uuid5(delivery_id)`` and ``apns-collapse-id = delivery_id`` (a
resend after TIMEOUT_UNKNOWN replaces, on the device, the notification it may
duplicate) and put ``notify_id`` in the payload so the app can drop
duplicates. :meth:`ApnsProvider.query` therefore answers ``supported=False``.

Point it at Apple with ``base_url="https://api.push.apple.com"`` (or
``https://api.sandbox.push.apple.com``) and a real .p8 key; the simulator is
reached over cleartext HTTP/2 with prior knowledge (``http://127.0.0.1:port``).

Transport: one HTTP/2 connection multiplexing every push
(:class:`adapters._h2.H2Transport`, on ``h2``), called directly rather than
through httpx's client layers (URL merging, cookie extraction: 0.3 ms of the
0.7 ms a push cost through them), so a push carries the APNs headers above and
none of httpx's defaults (accept, accept-encoding, user-agent); a client given
to the constructor (a test's) is used as it is. Both raise httpx's exceptions,
mapped by :func:`adapters._http.exception_result`.
"""

from __future__ import annotations

import hashlib
import math
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Optional
from urllib.parse import quote

import httpx
import jwt
import orjson

from pipeline.models import AttemptResult, Delivery, Priority
from pipeline.parsers.events import PUSH_PLATFORMS

from ._h2 import H2Transport, Origin
from ._http import client_for, exception_result, response_json
from ._token import TokenProvider
from .base import Fault, PermanentKind, SendResult, Stopwatch, parse_retry_after

__all__ = ["ApnsConfig", "ApnsProvider", "apns_id_for", "apns_outcome", "collapse_id_for", "split_push_address", "unregistered_at",
           "wrong_platform"]

#: namespace for apns-id = uuid5(NS, delivery_id)
APNS_ID_NAMESPACE = uuid.UUID("6f1c2b1e-3c1a-5d7e-9a43-2f5b8e0c4d11")

BAD_TOKEN_REASONS = frozenset({"BadDeviceToken", "Unregistered", "ExpiredToken"})
#: our topic (bundle id) does not fit the token or the key: configuration, never the device
CONFIG_REASONS = frozenset({"DeviceTokenNotForTopic", "TopicDisallowed", "BadTopic", "MissingTopic"})
PROVIDER_TOKEN_REASONS = frozenset({"ExpiredProviderToken", "InvalidProviderToken", "MissingProviderToken"})
#: Apple refuses provider tokens renewed more often than every 20 minutes
#: (429 TooManyProviderTokenUpdates) and tokens older than 60 minutes
MIN_TOKEN_RENEWAL_S = 20 * 60.0


@dataclass
class ApnsConfig:
    team_id: str
    key_id: str
    private_key: str | bytes  #: PEM of the .p8 (EC P-256) signing key
    topic: str  #: the app's bundle id
    base_url: str = "https://api.push.apple.com"
    timeout: float = 10.0
    connect_timeout: float = 5.0
    token_ttl: float = 50 * 60.0  #: renew our JWT after this many seconds (< 3600)
    #: never mint a JWT sooner than this after the last one (Apple: 20 min)
    token_min_renewal: float = MIN_TOKEN_RENEWAL_S
    #: back-off of a delivery whose device is throttled (429 TooManyRequests
    #: without Retry-After; Apple publishes no figure)
    device_retry_after: float = 30.0
    expiration_s: int = 24 * 3600  #: apns-expiration = now + this (0: deliver now or never)
    push_type: str = "alert"
    verify: Any = True  #: TLS verification (bool, CA bundle path or SSLContext)
    max_connections: int = 10  #: unused: HTTP/2 multiplexes every push on one connection
    name: str = "apns"


def apns_id_for(delivery_id: str) -> str:
    try:
        return str(uuid.UUID(delivery_id))
    except ValueError:
        return str(uuid.uuid5(APNS_ID_NAMESPACE, delivery_id))


def collapse_id_for(delivery_id: str) -> str:
    if len(delivery_id.encode()) <= 64:
        return delivery_id
    return hashlib.sha256(delivery_id.encode()).hexdigest()[:64]


def apns_outcome(status: int, reason: Optional[str]) -> tuple[str, Optional[str], Optional[str], str]:
    """What an APNs answer means: ``(result, permanent_kind, fault, error prefix)``."""
    if status == 200:
        return AttemptResult.ACCEPTED, None, None, ""
    if reason in BAD_TOKEN_REASONS or status == 410:
        return AttemptResult.PERMANENT_ERROR, PermanentKind.BAD_TOKEN, None, ""
    if reason in CONFIG_REASONS:
        return AttemptResult.TRANSIENT_ERROR, None, Fault.CONFIG, "config: "
    if status == 429:
        if reason == "TooManyProviderTokenUpdates":
            return AttemptResult.RATE_LIMITED, None, Fault.CONFIG, "auth: "
        return AttemptResult.RATE_LIMITED, None, Fault.RECIPIENT, ""
    if status == 403:
        return AttemptResult.TRANSIENT_ERROR, None, Fault.CONFIG, "auth: "
    if status >= 500:
        return AttemptResult.TRANSIENT_ERROR, None, None, ""
    return AttemptResult.PERMANENT_ERROR, PermanentKind.INVALID_REQUEST, None, ""


def unregistered_at(body: dict[str, Any]) -> Optional[float]:
    """Apple's 410 ``timestamp`` (milliseconds since the epoch) in seconds, or None."""
    ts = body.get("timestamp")
    if isinstance(ts, bool) or not isinstance(ts, (int, float)):
        try:
            ts = float(str(ts)) if ts is not None else None
        except ValueError:
            ts = None
    if ts is None or not math.isfinite(ts) or ts <= 0:
        return None
    return ts / 1000.0


def split_push_address(address: str) -> tuple[Optional[str], str]:
    """``"apns:<token>"`` → ("apns", token) (any of ``PUSH_PLATFORMS``: apns, fcm,
    hms); a bare token → (None, token)."""
    platform, sep, token = address.partition(":")
    if sep and platform in PUSH_PLATFORMS:
        return platform, token
    return None, address


def wrong_platform(provider: str, ours: str, platform: Optional[str], latency_ms: float = 0.0) -> SendResult:
    """A token of another platform reached this provider (a push route without a
    provider of that platform: the dispatcher then tries the route's providers in
    order): PERMANENT_ERROR ``rejected``, never ``bad_token``: the token is good,
    our route lacks its provider, so the device is kept."""
    return SendResult(AttemptResult.PERMANENT_ERROR, provider, permanent_kind=PermanentKind.REJECTED,
                      error=f"a {platform} token, and {provider} is a {ours} provider: no {platform} provider "
                            f"on the push route", latency_ms=latency_ms)


class ApnsProvider(TokenProvider):
    channel = "push"
    config: ApnsConfig
    http2 = True  #: APNs speaks HTTP/2 only

    def __init__(self, config: ApnsConfig, *, clock: Callable[[], float] = time.time,
                 client: Optional[httpx.AsyncClient] = None) -> None:
        #: the transport pushes go over directly (None: through the client given)
        self._h2: Optional[H2Transport] = None
        if client is None:
            self._h2 = H2Transport(verify=config.verify)
            client = client_for(config, http2=True, transport=self._h2)
        super().__init__(config, clock=clock, client=client)
        self._origin: Optional[Origin] = None
        if self._h2 is not None:
            try:
                self._origin = Origin.of(self._client.base_url)
            except httpx.UnsupportedProtocol:  # not http(s): each push says so, through the client
                self._h2 = None
        self._timeout = {"connect": config.connect_timeout, "pool": config.connect_timeout, "read": config.timeout,
                         "write": config.timeout}
        self._prefix = self._client.base_url.raw_path.rstrip(b"/")  # a base_url with a path

    # ------------------------------------------------------------ auth token

    def bearer_token(self, force: bool = False) -> str:
        """The provider JWT, cached and renewed after ``token_ttl``."""
        token = None if force else self._token.current()
        if token is None:
            iat = int(self._clock())
            token = jwt.encode(
                {"iss": self.config.team_id, "iat": iat},
                self.config.private_key,
                algorithm="ES256",
                headers={"kid": self.config.key_id},
            )
            self._token.put(token, self.config.token_ttl, issued_at=float(iat))
        return token

    def renew_token(self, refused: str) -> Optional[str]:
        """The token to retry with after Apple refused ``refused``, or None when
        none may be minted yet (``token_min_renewal`` since the last).

        Single flight: minting is synchronous, so of the requests refused with
        the same token the first renews and the others find a token other than
        the one refused and take it, without an await in between."""
        last = self._token.value
        if last is not None and last != refused:
            return last
        if last is not None and self._clock() - self._token.issued_at < self.config.token_min_renewal:
            return None
        return self.bearer_token(force=True)

    def renewal_in(self) -> float:
        """Seconds until a new token may be minted."""
        return max(0.0, self._token.issued_at + self.config.token_min_renewal - self._clock())

    # ------------------------------------------------------------ send

    def build_request(self, delivery: Delivery) -> tuple[str, dict[str, str], bytes]:
        _, token = split_push_address(delivery.address)
        content = delivery.content or {}
        alert: dict[str, Any] = {}
        for k in ("title", "subtitle", "body"):
            if content.get(k):
                alert[k] = content[k]
        aps: dict[str, Any] = {}
        push_type = content.get("push_type") or self.config.push_type
        if alert:
            aps["alert"] = alert
        if "badge" in content:
            aps["badge"] = content["badge"]
        if content.get("sound"):
            aps["sound"] = content["sound"]
        if content.get("thread_id"):
            aps["thread-id"] = content["thread_id"]
        if content.get("category"):
            aps["category"] = content["category"]
        if not alert and content.get("content_available"):
            aps["content-available"] = 1
            push_type = "background"
        payload: dict[str, Any] = {"aps": aps, "notify_id": delivery.delivery_id}
        data = content.get("data")
        if isinstance(data, dict):
            for k, v in data.items():
                if k != "aps":
                    payload[k] = v
        # background pushes must use priority 5
        priority = "10" if delivery.priority == Priority.HIGH and push_type != "background" else "5"
        expiration = 0 if self.config.expiration_s <= 0 else int(self._clock()) + int(self.config.expiration_s)
        headers = {
            "apns-topic": self.config.topic,
            "apns-push-type": push_type,
            "apns-priority": priority,
            "apns-id": apns_id_for(delivery.delivery_id),
            "apns-expiration": str(expiration),
            "apns-collapse-id": collapse_id_for(delivery.delivery_id),
            "content-type": "application/json",
        }
        return f"/3/device/{token}", headers, orjson.dumps(payload)

    async def send(self, delivery: Delivery) -> SendResult:
        sw = Stopwatch()
        platform, token = split_push_address(delivery.address)
        if platform not in (None, "apns"):
            return wrong_platform(self.name, "apns", platform, sw.ms)
        if not token:
            return SendResult(
                AttemptResult.PERMANENT_ERROR,
                self.name,
                error=f"not an APNs address: {delivery.address[:40]!r}",
                permanent_kind=PermanentKind.BAD_TOKEN,
                latency_ms=sw.ms,
            )
        path, headers, body = self.build_request(delivery)
        renewed = False
        while True:
            token = self.bearer_token()
            headers["authorization"] = f"bearer {token}"
            try:
                resp = await self._post(path, headers, body)
            except Exception as exc:  # noqa: BLE001 - mapped, never raised
                return exception_result(self.name, exc, sw.ms)
            answer = response_json(resp) if resp.status_code != 200 else {}
            reason = answer.get("reason") if isinstance(answer.get("reason"), str) else None
            if resp.status_code == 403 and reason in PROVIDER_TOKEN_REASONS and not renewed:
                if self.renew_token(token) is not None:
                    renewed = True
                    continue
            return self._map(resp, answer, headers["apns-id"], sw.ms)

    async def _post(self, path: str, headers: dict[str, str], body: bytes) -> httpx.Response:
        if self._h2 is None or self._origin is None:
            return await self._client.post(path, content=body, headers=headers)
        # as httpx would send it: the device token percent-encoded where a path needs
        # it, header values ASCII (anything else raises, a TRANSIENT_ERROR as ever)
        return await self._h2.request(self._origin, b"POST", self._prefix + quote(path, safe="/:@!$&'()*+,;=").encode(),
                                      [(k.encode(), v.encode("ascii")) for k, v in headers.items()], body,
                                      self._timeout)

    def _map(self, resp: httpx.Response, answer: dict[str, Any], apns_id: str, latency_ms: float) -> SendResult:
        status = resp.status_code
        reason = answer.get("reason") if isinstance(answer.get("reason"), str) else None
        result, kind, fault, prefix = apns_outcome(status, reason)
        if result == AttemptResult.ACCEPTED:
            return SendResult(result, self.name, provider_msg_id=resp.headers.get("apns-id", apns_id), latency_ms=latency_ms)
        err = f"{prefix}{status} {reason or resp.reason_phrase}"
        retry_after = parse_retry_after(resp.headers.get("retry-after"))
        if fault == Fault.RECIPIENT and retry_after is None:
            retry_after = self.config.device_retry_after
        if status == 403 and reason in PROVIDER_TOKEN_REASONS and retry_after is None:
            retry_after = self.renewal_in() or None
        return SendResult(
            result,
            self.name,
            error=err,
            retry_after=retry_after if result != AttemptResult.PERMANENT_ERROR else None,
            permanent_kind=kind,
            fault=fault,
            unregistered_at=unregistered_at(answer) if status == 410 else None,
            latency_ms=latency_ms,
        )
