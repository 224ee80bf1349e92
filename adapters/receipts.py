"""Delivery-receipt callbacks: signature checks, replay guard, parsers.

Providers POST receipts to ``/v1/receipts/<provider>``; the HTTP endpoint (not
in this package) hands the raw request to :class:`ReceiptVerifier`, which

1. checks the signature (forged → :class:`ReceiptRejected` ``bad_signature``),
2. checks the timestamp, where the scheme has one (``stale``),
3. asks the replay guard whether this exact signed callback was seen before
   (``replay``),
4. parses the body into :class:`pipeline.models.Receipt` records (intermediate
   statuses such as ``queued``/``sent`` yield nothing: only DELIVERED and
   UNDELIVERED are receipts).

Schemes:

* **Twilio** ``X-Twilio-Signature``: base64(HMAC-SHA1(auth_token, URL +
  concatenation of the POST parameters sorted by name, each as name+value)).
  The URL is the exact one Twilio called (scheme, host, port, path, query);
  we also try it with and without the default port, as Twilio's own
  validator does. There is no timestamp, so replays are caught by the guard
  alone, remembering signatures for ``twilio_replay_ttl`` (24 h).
* **Vendor** (provider B): ``X-Vendor-Timestamp: <unix s>`` and
  ``X-Vendor-Signature: sha256=<hex HMAC-SHA256(secret, "<ts>.<body>")>``;
  timestamps further than ``tolerance`` (300 s) from now are rejected, and
  signatures are remembered for twice the tolerance.

The replay guard is an interface (:class:`ReplayGuard`): :class:`MemoryReplayGuard`
is an in-process LRU; :class:`RedisReplayGuard` shares it across workers with
``SET key 1 NX PX ttl``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import math
import time
from collections import OrderedDict
from typing import Any, Callable, Iterable, Mapping, Optional, Protocol, Sequence, Union
from urllib.parse import urlsplit, urlunsplit

import orjson

from pipeline.models import Receipt
from pipeline.rules.validate import MAX_PROVIDER_MSG_ID as MAX_MSG_ID

from .webhook import sign as _hmac_sha256_hex

__all__ = [
    "ReceiptRejected",
    "ReplayGuard",
    "MemoryReplayGuard",
    "RedisReplayGuard",
    "ReceiptVerifier",
    "twilio_signature",
    "verify_twilio_signature",
    "vendor_signature_header",
    "verify_vendor_signature",
    "parse_twilio_callback",
    "parse_vendor_callback",
]

Params = Union[Mapping[str, Any], Sequence[tuple[str, str]]]

#: an error text is cut to this length
MAX_ERROR = 200


class ReceiptRejected(Exception):
    """A callback we refuse. ``reason``: bad_signature | stale | replay | malformed."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


# ---------------------------------------------------------------- replay guard


class ReplayGuard(Protocol):
    async def first_seen(self, key: str, ttl: float) -> bool:
        """Atomically remember ``key`` for ``ttl`` seconds; True if it was not
        already remembered (a fresh callback), False for a replay."""
        ...


class MemoryReplayGuard:
    """In-process LRU of recently seen keys with per-key expiry.

    Bounded by ``max_entries`` (oldest forgotten first). A key forgotten early
    under a flood is still covered by the timestamp tolerance for timestamped
    schemes; for Twilio, size it for a day of callbacks or use Redis.
    """

    def __init__(self, max_entries: int = 100_000, now: Callable[[], float] = time.monotonic) -> None:
        self.max_entries = max_entries
        self._now = now
        self._seen: OrderedDict[str, float] = OrderedDict()

    async def first_seen(self, key: str, ttl: float) -> bool:
        return self.first_seen_sync(key, ttl)

    def first_seen_sync(self, key: str, ttl: float) -> bool:
        now = self._now()
        exp = self._seen.get(key)
        if exp is not None and exp > now:
            self._seen.move_to_end(key)
            return False
        self._seen[key] = now + ttl
        self._seen.move_to_end(key)
        # drop expired entries at the old end, then enforce the bound
        while self._seen:
            k, e = next(iter(self._seen.items()))
            if e <= now or len(self._seen) > self.max_entries:
                self._seen.popitem(last=False)
            else:
                break
        return True

    def __len__(self) -> int:
        return len(self._seen)


class RedisReplayGuard:
    """The same guard shared by all workers: ``SET <prefix><key> 1 NX PX <ttl>``.

    ``redis`` is a ``redis.asyncio.Redis`` (or anything with the same ``set``).
    """

    def __init__(self, redis: Any, prefix: str = "notify:receipt-seen:") -> None:
        self.redis = redis
        self.prefix = prefix

    async def first_seen(self, key: str, ttl: float) -> bool:
        return bool(await self.redis.set(self.prefix + key, b"1", nx=True, px=max(1, int(ttl * 1000))))


# ---------------------------------------------------------------- Twilio


def _pairs(params: Params) -> list[tuple[str, str]]:
    if isinstance(params, Mapping):
        out: list[tuple[str, str]] = []
        getall = getattr(params, "getall", None)  # multidict
        for k in set(params.keys()):
            values = getall(k) if getall else params[k]
            if isinstance(values, (list, tuple)):
                out.extend((k, str(v)) for v in values)
            else:
                out.append((k, str(values)))
        return out
    return [(str(k), str(v)) for k, v in params]


def twilio_signature(auth_token: str, url: str, params: Params) -> str:
    """Twilio's X-Twilio-Signature for a form POST to ``url``."""
    pairs = _pairs(params)
    s = url + "".join(k + v for k, v in sorted(set(pairs)))
    mac = hmac.new(auth_token.encode(), s.encode("utf-8", "surrogatepass"), hashlib.sha1)
    return base64.b64encode(mac.digest()).decode()


def _url_variants(url: str) -> list[str]:
    parts = urlsplit(url)
    default = {"https": 443, "http": 80}.get(parts.scheme)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    variants = [url]
    if default is not None:
        if parts.port is None:
            variants.append(urlunsplit(parts._replace(netloc=f"{host}:{default}")))
        elif parts.port == default:
            variants.append(urlunsplit(parts._replace(netloc=host)))
    return variants


def verify_twilio_signature(auth_token: str, url: str, params: Params, signature: Optional[str]) -> bool:
    if not signature:
        return False
    for u in _url_variants(url):
        if hmac.compare_digest(twilio_signature(auth_token, u, params), signature.strip()):
            return True
    return False


_TWILIO_FINAL = {"delivered": "DELIVERED", "read": "DELIVERED", "undelivered": "UNDELIVERED", "failed": "UNDELIVERED"}


def parse_twilio_callback(params: Params, provider: str = "twilio", now: Optional[float] = None) -> Optional[Receipt]:
    """A Twilio status callback → Receipt, or None for a non-final status."""
    d = dict(_pairs(params))
    sid = (d.get("MessageSid") or d.get("SmsSid") or "").strip()
    status = (d.get("MessageStatus") or d.get("SmsStatus") or "").lower()
    if not sid or not status:
        raise ReceiptRejected("malformed", "no MessageSid/MessageStatus")
    if len(sid) > MAX_MSG_ID:
        raise ReceiptRejected("malformed", f"MessageSid longer than {MAX_MSG_ID}")
    final = _TWILIO_FINAL.get(status)
    if final is None:
        return None
    error = (d.get("ErrorCode") or "")[:MAX_ERROR] or None
    if final == "UNDELIVERED" and not error:
        error = status
    return Receipt(provider=provider, provider_msg_id=sid, status=final, at=time.time() if now is None else now, error=error)


# ---------------------------------------------------------------- vendor (provider B)


def vendor_signature_header(secret: str | bytes, timestamp: int | str, body: bytes) -> str:
    return "sha256=" + _hmac_sha256_hex(secret, timestamp, body)


def verify_vendor_signature(secret: str | bytes, timestamp: Optional[str], body: bytes, header: Optional[str]) -> bool:
    """Signature only (freshness is checked by the verifier against its clock)."""
    if not header or timestamp is None:
        return False
    scheme, _, value = header.strip().partition("=")
    if scheme != "sha256":
        return False
    return hmac.compare_digest(value.strip().lower(), _hmac_sha256_hex(secret, str(timestamp).strip(), body))


_VENDOR_FINAL = {
    "delivered": "DELIVERED",
    "failed": "UNDELIVERED",
    "undelivered": "UNDELIVERED",
    "expired": "UNDELIVERED",
    "rejected": "UNDELIVERED",
}


def parse_vendor_callback(body: bytes | str | Mapping[str, Any] | list, provider: str = "smsvendor", now: Optional[float] = None) -> list[Receipt]:
    """``{"message_id", "status", "error"?, "timestamp"?}``, a list of them or
    ``{"receipts": [...]}`` → Receipts (non-final statuses are skipped)."""
    if isinstance(body, (bytes, str)):
        try:
            body = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise ReceiptRejected("malformed", f"json: {exc}") from None
    items: Iterable[Any]
    if isinstance(body, Mapping) and "receipts" in body:
        items = body["receipts"]
        if not isinstance(items, list):
            raise ReceiptRejected("malformed", "receipts is not a list")
    elif isinstance(body, Mapping):
        items = [body]
    elif isinstance(body, list):
        items = body
    else:
        raise ReceiptRejected("malformed", "not an object or a list")
    out: list[Receipt] = []
    for item in items:
        if not isinstance(item, Mapping) or not item.get("message_id") or not item.get("status"):
            raise ReceiptRejected("malformed", "receipt without message_id/status")
        msg_id, status = item["message_id"], item["status"]
        if isinstance(msg_id, bool) or not isinstance(msg_id, (str, int)) or not str(msg_id).strip():
            raise ReceiptRejected("malformed", "message_id is not a string")
        msg_id = str(msg_id).strip()
        if len(msg_id) > MAX_MSG_ID:
            raise ReceiptRejected("malformed", f"message_id longer than {MAX_MSG_ID}")
        if not isinstance(status, str):
            raise ReceiptRejected("malformed", "status is not a string")
        final = _VENDOR_FINAL.get(status.lower())
        if final is None:
            continue
        at_f = _unix_time(item.get("timestamp"))
        if at_f is None:
            at_f = time.time() if now is None else now
        error = item.get("error")
        if error is not None and (isinstance(error, bool) or not isinstance(error, (str, int, float))):
            raise ReceiptRejected("malformed", "error is not a string")
        error = str(error)[:MAX_ERROR] if error not in (None, "") else None
        if error is None and final == "UNDELIVERED":
            error = status.lower()[:MAX_ERROR]
        out.append(Receipt(provider=provider, provider_msg_id=msg_id, status=final, at=at_f, error=error))
    return out


def _unix_time(value: Any) -> Optional[float]:
    """A finite, non-negative unix time from a number or a numeric string; else None."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        t = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return t if math.isfinite(t) and t >= 0 else None


# ---------------------------------------------------------------- verifier


class ReceiptVerifier:
    """Verifies and parses receipt callbacks for the configured providers."""

    def __init__(
        self,
        *,
        twilio_auth_token: Optional[str] = None,
        vendor_secret: Optional[str | bytes] = None,
        guard: Optional[ReplayGuard] = None,
        tolerance: float = 300.0,
        twilio_replay_ttl: float = 24 * 3600.0,
        now: Callable[[], float] = time.time,
        twilio_provider: str = "twilio",
        vendor_provider: str = "smsvendor",
    ) -> None:
        self.twilio_auth_token = twilio_auth_token
        self.vendor_secret = vendor_secret
        self.guard: ReplayGuard = guard if guard is not None else MemoryReplayGuard()
        self.tolerance = tolerance
        self.twilio_replay_ttl = twilio_replay_ttl
        self._now = now
        self.twilio_provider = twilio_provider
        self.vendor_provider = vendor_provider

    async def twilio(self, url: str, params: Params, signature: Optional[str]) -> Optional[Receipt]:
        """``url``: the full URL Twilio POSTed to; ``params``: the form fields."""
        if not self.twilio_auth_token:
            raise ReceiptRejected("bad_signature", "no Twilio auth token configured")
        if not verify_twilio_signature(self.twilio_auth_token, url, params, signature):
            raise ReceiptRejected("bad_signature", "X-Twilio-Signature mismatch")
        key = "twilio:" + hashlib.sha256((signature or "").encode()).hexdigest()
        if not await self.guard.first_seen(key, self.twilio_replay_ttl):
            raise ReceiptRejected("replay", "signature seen before")
        return parse_twilio_callback(params, self.twilio_provider, now=self._now())

    async def vendor(self, body: bytes, timestamp: Optional[str], signature: Optional[str]) -> list[Receipt]:
        """``timestamp``/``signature``: the X-Vendor-Timestamp / X-Vendor-Signature headers."""
        if self.vendor_secret is None:
            raise ReceiptRejected("bad_signature", "no vendor secret configured")
        if not verify_vendor_signature(self.vendor_secret, timestamp, body, signature):
            raise ReceiptRejected("bad_signature", "X-Vendor-Signature mismatch")
        ts = _unix_time(str(timestamp).strip())
        if ts is None:  # "nan" would pass any comparison: never a valid time
            raise ReceiptRejected("malformed", "timestamp is not a unix time")
        if abs(self._now() - ts) > self.tolerance:
            raise ReceiptRejected("stale", f"timestamp {ts:.0f} outside ±{self.tolerance:.0f}s")
        key = "vendor:" + (signature or "").strip().lower()
        if not await self.guard.first_seen(key, 2 * self.tolerance):
            raise ReceiptRejected("replay", "signature seen before")
        return parse_vendor_callback(body, self.vendor_provider, now=self._now())
