"""The provider interface: the edge where provider protocols live.

Every adapter turns one :class:`~pipeline.models.Delivery` into one provider call
and maps whatever happened into a :class:`SendResult` whose ``result`` is one of
:class:`~pipeline.models.AttemptResult`. ``send`` never raises for provider or
network errors; the mapping rules are the same for every HTTP adapter:

====================================================  =====================
what happened                                         result
====================================================  =====================
2xx, the provider took the message                    ``ACCEPTED``
could not connect (refused, DNS, connect timeout,     ``TRANSIENT_ERROR``
pool timeout): the request never left                 (safe to resend / fail over)
the request was (maybe) sent, then the read timed     ``TIMEOUT_UNKNOWN``
out or the connection dropped                         (reconcile before resending)
429                                                   ``RATE_LIMITED`` (``retry_after``
                                                      from ``Retry-After``, seconds)
5xx, 408                                              ``TRANSIENT_ERROR``
401/403 (our credentials, not the recipient)          ``TRANSIENT_ERROR``, ``error="auth: …"``
other 4xx                                             ``PERMANENT_ERROR`` + ``permanent_kind``
====================================================  =====================

Where the status alone would blame the wrong party, ``SendResult.fault`` says
whose fault it was (:class:`Fault`): one device's (APNs 429 TooManyRequests),
one route's (Twilio 21408) or our configuration's (APNs DeviceTokenNotForTopic,
FCM THIRD_PARTY_AUTH_ERROR). The breaker counts only the provider's and our
configuration's faults; failover skips a recipient's.

The idempotency key sent to providers is always ``delivery.delivery_id``; the
reconciliation query (:meth:`Provider.query`) looks a message up by that key
(or by ``provider_msg_id`` when we have it).
"""

from __future__ import annotations

import abc
import email.utils
import time
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Optional

from pipeline.models import AttemptResult, Delivery
from pipeline.rules.tracking import list_unsubscribe_headers

__all__ = [
    "AttemptResult",
    "SendResult",
    "QueryResult",
    "QueryStatus",
    "PermanentKind",
    "Fault",
    "Provider",
    "parse_retry_after",
    "classify_http_status",
    "Stopwatch",
    "email_bodies",
    "unsubscribe_headers",
]


class QueryStatus:
    """What a reconciliation query learnt about a message."""

    ACCEPTED = "ACCEPTED"  #: the provider has it (queued / sent / in flight)
    DELIVERED = "DELIVERED"  #: the provider reports it delivered
    UNDELIVERED = "UNDELIVERED"  #: the provider has it and reports it failed
    NOT_FOUND = "NOT_FOUND"  #: the provider does not have it (safe to resend)
    #: the query itself failed (network, 5xx, auth): we learnt nothing, ask again later.
    #: Never treat ERROR like NOT_FOUND: that would turn a blip into a duplicate.
    ERROR = "ERROR"

    ALL = (ACCEPTED, DELIVERED, UNDELIVERED, NOT_FOUND, ERROR)


class PermanentKind:
    """Values of ``SendResult.permanent_kind``: why a PERMANENT_ERROR is permanent."""

    BAD_TOKEN = "bad_token"  #: push token unknown/unregistered: remove the device
    INVALID_NUMBER = "invalid_number"  #: phone number cannot receive SMS
    INVALID_ADDRESS = "invalid_address"  #: e-mail recipient rejected (5xx at RCPT)
    OPTED_OUT = "opted_out"  #: the carrier/provider holds an opt-out (STOP) for it
    TARGET_REFUSED = "target_refused"  #: webhook URL refused by the target guard
    GONE = "gone"  #: webhook receiver answered 410
    INVALID_REQUEST = "invalid_request"  #: payload rejected (too large, malformed, …)
    #: the delivery's address is not one of its channel (a control character, a
    #: space in a URL, …): refused before any call, never retried
    BAD_ADDRESS = "bad_address"
    REJECTED = "rejected"  #: any other permanent refusal


class Fault:
    """Values of ``SendResult.fault``: whose fault a failed call was, when the
    status alone does not say. The breaker and failover read it
    (:func:`adapters.resilience.breaker.counts_as_success`,
    :func:`adapters.resilience.failover.may_failover`); ``None`` means "as the
    result says" (a 5xx or a timeout is the provider's)."""

    #: this one recipient or device (APNs 429 TooManyRequests: too many pushes to
    #: one device token): that delivery backs off; the provider is healthy, the
    #: breaker does not count it and no other provider is tried
    RECIPIENT = "recipient"
    #: this destination cannot go through this provider (Twilio 21408: the
    #: number's region is not enabled on the account): the provider is healthy,
    #: another provider may take it
    ROUTE = "route"
    #: our configuration of this provider is wrong (APNs DeviceTokenNotForTopic or
    #: a topic refused, FCM THIRD_PARTY_AUTH_ERROR): not the recipient's fault, so
    #: no device is removed; it counts against the provider's breaker and is
    #: reported (``Dispatcher(on_fault=...)``) for someone to fix
    CONFIG = "config"

    ALL = (RECIPIENT, ROUTE, CONFIG)


@dataclass
class SendResult:
    """Outcome of one provider call (becomes one ``Attempt`` record)."""

    result: str  #: one of AttemptResult.*
    provider: str
    provider_msg_id: Optional[str] = None
    retry_after: Optional[float] = None  #: seconds, from Retry-After on 429 (or 503)
    error: Optional[str] = None
    latency_ms: float = 0.0
    permanent_kind: Optional[str] = None  #: e.g. "bad_token", "invalid_number"
    fault: Optional[str] = None  #: one of :class:`Fault` (None: as ``result`` says)
    #: with ``bad_token``: when the provider learnt the token was no longer valid
    #: (APNs 410 ``timestamp``, unix seconds). The device may be removed only if it
    #: was not registered again after this time; None: the provider did not say
    unregistered_at: Optional[float] = None

    @property
    def ok(self) -> bool:
        return self.result == AttemptResult.ACCEPTED

    def asdict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class QueryResult:
    """Answer of a reconciliation query by our idempotency key (``delivery_id``).

    ``supported`` is False for providers whose protocol has no status query
    (APNs, FCM, SMTP, webhooks): then the answer is ``found=False,
    status=NOT_FOUND`` and means "truly unknown", not "the provider does not
    have it". The caller decides (resend under the same collapse id /
    Message-ID / X-Notify-Id so the far end can de-duplicate, or REVIEW).
    ``status == ERROR`` means the query itself failed: ask again later.
    """

    found: bool
    provider_msg_id: Optional[str] = None
    status: str = QueryStatus.NOT_FOUND
    supported: bool = True
    error: Optional[str] = None
    provider: Optional[str] = None

    def asdict(self) -> dict[str, Any]:
        return asdict(self)


class Provider(abc.ABC):
    """One provider (one wire protocol) for one channel.

    ``name`` identifies the provider in attempts, breakers, buckets and receipts
    (e.g. ``"twilio"``); ``channel`` is one of inbox|push|sms|email|webhook.
    """

    name: str
    channel: str

    @abc.abstractmethod
    async def send(self, delivery: Delivery) -> SendResult:
        """Send one delivery; never raises for provider or network errors."""

    @property
    def status_query(self) -> bool:
        """Whether :meth:`query` can tell DELIVERED from ACCEPTED (the provider has a
        status endpoint): the receipt polls (agents/polls.py) ask only these."""
        return type(self).query is not Provider.query

    async def query(self, delivery_id: str, provider_msg_id: Optional[str] = None) -> QueryResult:
        """Reconcile: does the provider have the message sent under ``delivery_id``?

        Never raises for provider or network errors (answers ``status=ERROR``).
        The default is for protocols without a status query.
        """
        return QueryResult(
            found=False,
            provider_msg_id=provider_msg_id,
            status=QueryStatus.NOT_FOUND,
            supported=False,
            provider=self.name,
        )

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""

    async def __aenter__(self) -> "Provider":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self.name!r} channel={self.channel!r}>"


# ---------------------------------------------------------------- helpers


def parse_retry_after(value: Optional[str], now: Optional[float] = None) -> Optional[float]:
    """``Retry-After`` (delay-seconds or HTTP-date, RFC 9110 §10.2.3) → seconds ≥ 0."""
    if value is None:
        return None
    value = value.strip()
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        dt = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if dt is None:
        return None
    now = time.time() if now is None else now
    return max(0.0, dt.timestamp() - now)


def classify_http_status(status: int) -> str:
    """Generic mapping of an HTTP status to an AttemptResult (see module doc)."""
    if 200 <= status < 300:
        return AttemptResult.ACCEPTED
    if status == 429:
        return AttemptResult.RATE_LIMITED
    if status >= 500 or status in (408, 401, 403):
        return AttemptResult.TRANSIENT_ERROR
    return AttemptResult.PERMANENT_ERROR


class Stopwatch:
    """Measures one call's latency in milliseconds (monotonic)."""

    __slots__ = ("_t0",)

    def __init__(self) -> None:
        self._t0 = time.perf_counter()

    @property
    def ms(self) -> float:
        return round((time.perf_counter() - self._t0) * 1000.0, 3)


def email_bodies(content: Mapping[str, Any]) -> tuple[Any, Any]:
    """``(text, html)`` of an e-mail's content: its ``text`` and ``html``, or, when it
    has neither, its ``body`` as the text (the e-mail adapters: SMTP, SendGrid, SES)."""
    text = content.get("text")
    html = content.get("html")
    if text is None and html is None:
        text = content.get("body") or ""
    return text, html


def unsubscribe_headers(content: Mapping[str, Any]) -> dict[str, str]:
    """RFC 8058's ``List-Unsubscribe`` and ``List-Unsubscribe-Post`` of an e-mail
    whose content carries its one-click link (``content["unsubscribe_url"]``, set
    by the guard for a category with ``one_click_unsubscribe``:
    pipeline/rules/plan.py), else none (the e-mail adapters: SendGrid, SES)."""
    url = content.get("unsubscribe_url")
    if not isinstance(url, str) or not url:
        return {}
    try:
        return list_unsubscribe_headers(url)
    except ValueError:
        return {}  # not a URL a header can carry: the mail goes without it


def header(headers: Mapping[str, str], name: str) -> Optional[str]:
    """Case-insensitive header lookup on any mapping."""
    get = getattr(headers, "get", None)
    if get is not None:
        v = get(name)
        if v is not None:
            return v
    lname = name.lower()
    for k, v in headers.items():
        if k.lower() == lname:
            return v
    return None
