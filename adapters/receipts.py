"""Delivery-receipt callbacks: signature checks, replay guard, parsers.

Providers POST receipts to ``/v1/receipts/<provider>``; the HTTP endpoint (not
in this package) hands the raw request to :class:`ReceiptVerifier`, which

1. checks the signature (forged → :class:`ReceiptRejected` ``bad_signature``),
2. checks the timestamp, where the scheme has one (``stale``),
3. asks the replay guard whether this exact signed callback was seen before,
4. parses the body into :class:`pipeline.models.Receipt` records (intermediate
   statuses such as ``queued``/``sent`` yield nothing: only DELIVERED and
   UNDELIVERED are receipts).

Schemes:

* **Twilio** ``X-Twilio-Signature``: base64(HMAC-SHA1(auth_token, URL +
  concatenation of the POST parameters sorted by name, each as name+value)),
  accepted as twilio's own ``RequestValidator`` accepts it (the test suite
  uses it as the judge): the URL is the full one Twilio called, query string
  included, tried as called, without its port (Twilio signs some callbacks
  without a non-default port) and with the default port; a callback signed
  with a SharedKey names it in ``X-Twilio-Webhooks-Signature-Settings:
  key=<id>,algorithm=HMAC_SHA256`` (the secret: ``twilio_shared_keys[id]``,
  else the Auth Token); a JSON callback carries ``bodySHA256=<hex SHA-256 of
  the body>`` in its URL and the signature covers the URL alone
  (:meth:`ReceiptVerifier.twilio_request` picks the variant). There is no
  timestamp: Twilio retries a callback whose answer it did not get, identical,
  so an identical callback seen again within ``twilio_replay_ttl`` (24 h) is
  acknowledged (``None``: answer 200) and not written again.
* **Vendor** (provider B): ``X-Vendor-Timestamp: <unix s>`` and
  ``X-Vendor-Signature: sha256=<hex HMAC-SHA256(secret, "<ts>.<body>")>``;
  timestamps further than ``tolerance`` (300 s) from now are rejected, and
  signatures are remembered for twice the tolerance (a repeat is ``replay``).
  A receipt's own ``timestamp`` (when the message was delivered) is at most
  ``receipt_max_age`` (7 days) old and ``receipt_max_ahead`` (300 s) ahead:
  ``malformed``, the field named (a time in milliseconds would be the year 33658).
* **Huawei Push Kit** (``X-HUAWEI-CALLBACK-ID``, the mechanism Push Kit documents for
  its receipt callback: the app's receipt configuration in AppGallery Connect has an
  HTTPS URL, a callback user name and a callback key; the header is ``timestamp=<ms>;
  nonce=<UUID>; value=base64(HMAC-SHA256(key, timestamp + nonce + user name))``),
  :meth:`ReceiptVerifier.hms`: compared in constant time, the timestamp within
  ``tolerance``; the header does not cover the body, so one header is taken once
  (``replay`` for another body under it) and the same body again is acknowledged
  and not written twice. The body is :func:`parse_hms_receipts`'.

The replay guard is keyed on what the signature *is*, never on how the header
spells it: the HMAC we recompute (vendor: ``sha256=<hex>`` of the digest; Twilio:
the base64 signature that matched), so " sha256= <HEX>" with blanks or capitals
inside, which verifies, is the same callback, a replay. Every receipt carries
the name of the scheme that verified it (``twilio`` / ``smsvendor``), never one
from its body: the receipts agent applies it only to a delivery of that provider.

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
from urllib.parse import parse_qs, parse_qsl, urlsplit, urlunsplit

import orjson

from pipeline.models import Receipt
from pipeline.parsers.events import MAX_PROVIDER_MSG_ID as MAX_MSG_ID
from pipeline.parsers.events import id_problem
from pipeline.transport.wire import run_commands

from .base import header as _header


def _hmac_sha256_hex(secret: str | bytes, timestamp: int | str, body: bytes) -> str:
    """Hex HMAC-SHA256 over ``b"<timestamp>." + body`` (the vendor's scheme)."""
    key = secret.encode() if isinstance(secret, str) else secret
    return hmac.new(key, str(timestamp).encode() + b"." + body, hashlib.sha256).hexdigest()

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
    "parse_hms_receipts",
    "HMS_CALLBACK_HEADER",
    "hms_callback_id",
    "hms_callback_value",
    "parse_hms_callback_id",
    "hms_receipt_config",
    "parse_form",
    "signature_settings",
    "body_sha256",
    "SIGNATURE_SETTINGS_HEADER",
]

Params = Union[Mapping[str, Any], Sequence[tuple[str, str]]]

#: an error text is cut to this length
MAX_ERROR = 200


class ReceiptRejected(Exception):
    """A callback we refuse. ``reason``: bad_signature | stale | replay | malformed;
    ``field``: the body's field to blame, when one is (``timestamp``,
    ``receipts[1].message_id``)."""

    def __init__(self, reason: str, detail: str = "", field: Optional[str] = None) -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail
        self.field = field


#: a receipt's own timestamp may be this old (a carrier retries for days) ...
RECEIPT_MAX_AGE = 7 * 86400.0
#: ... and this far ahead of our clock
RECEIPT_MAX_AHEAD = 300.0


def _msg_id_ok(value: str, field: str) -> None:
    problem = id_problem(value)
    if problem is not None:
        raise ReceiptRejected("malformed", f"{field}: {problem}", field=field)


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
    ``wire``: the API's own connection (pipeline/transport/wire.py), when it has
    one: the ``SET`` goes there, about 20 µs of the API's CPU less per receipt
    than through redis-py's client (docs/adr/0005).
    """

    def __init__(self, redis: Any, prefix: str = "notify:receipt-seen:", wire: Any = None) -> None:
        self.redis = redis
        self.prefix = prefix
        self.wire = wire

    async def first_seen(self, key: str, ttl: float) -> bool:
        px = max(1, int(ttl * 1000))
        if self.wire is None:
            return bool(await self.redis.set(self.prefix + key, b"1", nx=True, px=px))
        (reply,) = await run_commands(self.redis, self.wire, [("SET", self.prefix + key, b"1", "NX", "PX", px)])
        return reply is not None  # b"OK", or nil when the key was there


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


#: Twilio names the signing secret and algorithm of SharedKey-signed webhooks here
SIGNATURE_SETTINGS_HEADER = "X-Twilio-Webhooks-Signature-Settings"
_TWILIO_HASHES = {"HMAC_SHA1": hashlib.sha1, "HMAC_SHA256": hashlib.sha256}


def twilio_signature(auth_token: str, url: str, params: Params, algorithm: Optional[str] = None) -> str:
    """Twilio's X-Twilio-Signature for a POST to ``url``: base64(HMAC(secret,
    URL + each parameter's name and value, sorted)), HMAC-SHA1 unless
    ``algorithm`` is ``"HMAC_SHA256"`` (SharedKey signing)."""
    hash_fn = _TWILIO_HASHES.get((algorithm or "HMAC_SHA1").upper())
    if hash_fn is None:
        raise ValueError(f"unsupported Twilio signature algorithm {algorithm!r}")
    pairs = _pairs(params)
    s = url + "".join(k + v for k, v in sorted(set(pairs)))
    mac = hmac.new(auth_token.encode(), s.encode("utf-8", "surrogatepass"), hash_fn)
    return base64.b64encode(mac.digest()).decode()


def signature_settings(header_value: Optional[str]) -> tuple[Optional[str], str]:
    """``X-Twilio-Webhooks-Signature-Settings: key=<id>,algorithm=<alg>`` →
    ``(key id or None, algorithm)``; no header (or no algorithm): the Auth
    Token's HMAC_SHA1."""
    key_id: Optional[str] = None
    algorithm = "HMAC_SHA1"
    for part in (header_value or "").split(","):
        name, sep, value = part.partition("=")
        if sep and name.strip() == "key" and value.strip():
            key_id = value.strip()
        elif sep and name.strip() == "algorithm" and value.strip():
            algorithm = value.strip().upper()
    return key_id, algorithm


def _url_variants(url: str) -> list[str]:
    """The URLs a Twilio signature may have been computed over, as twilio's own
    ``RequestValidator`` tries them: the URL as called, without its port (any
    port: Twilio signs some callbacks without a non-default one), and with the
    scheme's default port when it has none."""
    parts = urlsplit(url)
    default = {"https": 443, "http": 80}.get(parts.scheme)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    userinfo = parts.netloc.rpartition("@")[0]
    userinfo = userinfo + "@" if userinfo else ""
    variants = [url]
    try:
        port = parts.port
    except ValueError:
        return variants
    if port is not None:
        variants.append(urlunsplit(parts._replace(netloc=userinfo + host)))
    elif default is not None:
        variants.append(urlunsplit(parts._replace(netloc=f"{userinfo}{host}:{default}")))
    return variants


def _twilio_match(
    auth_token: str, url: str, params: Params, signature: Optional[str], algorithm: Optional[str] = None
) -> Optional[str]:
    """The signature we compute that ``signature`` equals (for one of the URL
    variants), or None."""
    if not signature or (algorithm or "HMAC_SHA1").upper() not in _TWILIO_HASHES:
        return None
    for u in _url_variants(url):
        expected = twilio_signature(auth_token, u, params, algorithm)
        if hmac.compare_digest(expected.encode(), signature.strip().encode()):
            return expected
    return None


def verify_twilio_signature(
    auth_token: str, url: str, params: Params, signature: Optional[str], algorithm: Optional[str] = None
) -> bool:
    return _twilio_match(auth_token, url, params, signature, algorithm) is not None


def body_sha256(url: str) -> Optional[str]:
    """The ``bodySHA256`` query parameter of a callback URL (JSON callbacks), or None."""
    values = parse_qs(urlsplit(url).query, keep_blank_values=True).get("bodySHA256")
    return values[0] if values else None


def parse_form(body: bytes) -> list[tuple[str, str]]:
    """An ``application/x-www-form-urlencoded`` body → its pairs, in order
    (``malformed`` when it is not UTF-8)."""
    try:
        return parse_qsl(body.decode("utf-8"), keep_blank_values=True, max_num_fields=1000)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ReceiptRejected("malformed", f"not a form: {type(exc).__name__}") from None


def _json_params(body: bytes) -> list[tuple[str, str]]:
    """A JSON callback body (an object) → its scalar fields as strings."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ReceiptRejected("malformed", f"json: {exc}") from None
    if not isinstance(doc, dict):
        raise ReceiptRejected("malformed", "not a JSON object")
    out: list[tuple[str, str]] = []
    for k, v in doc.items():
        if isinstance(v, str):
            out.append((k, v))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append((k, str(v)))
    return out


_TWILIO_FINAL = {"delivered": "DELIVERED", "read": "DELIVERED", "undelivered": "UNDELIVERED", "failed": "UNDELIVERED"}


def parse_twilio_callback(params: Params, provider: str = "twilio", now: Optional[float] = None) -> Optional[Receipt]:
    """A Twilio status callback → Receipt, or None for a non-final status."""
    d = dict(_pairs(params))
    sid = (d.get("MessageSid") or d.get("SmsSid") or "").strip()
    status = (d.get("MessageStatus") or d.get("SmsStatus") or "").lower()
    if not sid or not status:
        raise ReceiptRejected("malformed", "no MessageSid/MessageStatus")
    if len(sid) > MAX_MSG_ID:
        raise ReceiptRejected("malformed", f"MessageSid longer than {MAX_MSG_ID}", field="MessageSid")
    _msg_id_ok(sid, "MessageSid")
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


def _vendor_match(secret: str | bytes, timestamp: Optional[str], body: bytes, header: Optional[str]) -> Optional[str]:
    """The hex HMAC we compute, when the header carries it; else None."""
    if not header or timestamp is None:
        return None
    scheme, _, value = header.strip().partition("=")
    if scheme != "sha256":
        return None
    expected = _hmac_sha256_hex(secret, str(timestamp).strip(), body)
    return expected if hmac.compare_digest(value.strip().lower(), expected) else None


def verify_vendor_signature(secret: str | bytes, timestamp: Optional[str], body: bytes, header: Optional[str]) -> bool:
    """Signature only (freshness is checked by the verifier against its clock)."""
    return _vendor_match(secret, timestamp, body, header) is not None


_VENDOR_FINAL = {
    "delivered": "DELIVERED",
    "failed": "UNDELIVERED",
    "undelivered": "UNDELIVERED",
    "expired": "UNDELIVERED",
    "rejected": "UNDELIVERED",
}


def parse_vendor_callback(
    body: bytes | str | Mapping[str, Any] | list, provider: str = "smsvendor", now: Optional[float] = None,
    *, max_age: Optional[float] = None, max_ahead: Optional[float] = None,
) -> list[Receipt]:
    """``{"message_id", "status", "error"?, "timestamp"?}``, a list of them or
    ``{"receipts": [...]}`` → Receipts (non-final statuses are skipped).

    With ``max_age`` / ``max_ahead`` (seconds; the verifier passes them), a
    ``timestamp`` older than ``now - max_age`` or later than ``now + max_ahead``
    is ``malformed`` with its field named."""
    if isinstance(body, (bytes, str)):
        try:
            body = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise ReceiptRejected("malformed", f"json: {exc}") from None
    items: Iterable[Any]
    where: Callable[[int], str]
    if isinstance(body, Mapping) and "receipts" in body:
        items = body["receipts"]
        if not isinstance(items, list):
            raise ReceiptRejected("malformed", "receipts is not a list", field="receipts")
        where = lambda i: f"receipts[{i}]."  # noqa: E731
    elif isinstance(body, Mapping):
        items = [body]
        where = lambda i: ""  # noqa: E731
    elif isinstance(body, list):
        items = body
        where = lambda i: f"[{i}]."  # noqa: E731
    else:
        raise ReceiptRejected("malformed", "not an object or a list")
    out: list[Receipt] = []
    for i, item in enumerate(items):
        if not isinstance(item, Mapping) or not item.get("message_id") or not item.get("status"):
            raise ReceiptRejected("malformed", "receipt without message_id/status")
        msg_id, status = item["message_id"], item["status"]
        if isinstance(msg_id, bool) or not isinstance(msg_id, (str, int)) or not str(msg_id).strip():
            raise ReceiptRejected("malformed", "message_id is not a string")
        msg_id = str(msg_id).strip()
        if len(msg_id) > MAX_MSG_ID:
            raise ReceiptRejected("malformed", f"message_id longer than {MAX_MSG_ID}", field=where(i) + "message_id")
        _msg_id_ok(msg_id, where(i) + "message_id")
        if not isinstance(status, str):
            raise ReceiptRejected("malformed", "status is not a string")
        final = _VENDOR_FINAL.get(status.lower())
        if final is None:
            continue
        at_f = _unix_time(item.get("timestamp"))
        ref = time.time() if now is None else now
        if at_f is None:
            at_f = ref
        elif (max_age is not None and at_f < ref - max_age) or (max_ahead is not None and at_f > ref + max_ahead):
            raise ReceiptRejected(
                "malformed", f"timestamp {at_f:.0f} is not within {max_age or 0:.0f} s before and "
                f"{max_ahead or 0:.0f} s after now (unix seconds)", field=where(i) + "timestamp")
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


#: Huawei Push Kit receipt states (developer.huawei.com/consumer/cn/doc/development/HMS-Guides/push-receipt):
#: 0 is delivered, 27 (a data message cached on the device until the app runs) is not final
HMS_RECEIPT_STATES = {
    2: "app not installed", 5: "token not of the device's current user", 6: "notifications not shown",
    10: "inactive device (30 days without Push Kit)", 15: "offline message replaced (collapse_key)",
    102: "dropped by the per-device frequency control", 201: "held by Push Kit (send control)",
}
HMS_NOT_FINAL = frozenset({27})


def parse_hms_receipts(
    body: bytes | str | Mapping[str, Any], provider: str = "hms", now: Optional[float] = None,
    *, max_age: Optional[float] = None, max_ahead: Optional[float] = None, clamp: bool = False,
) -> list[Receipt]:
    """A Huawei Push Kit receipt callback, ``{"statuses": [{"biTag", "appid", "token",
    "status", "timestamp" (ms), "requestId"}, ...]}`` (at most 100 a callback) →
    Receipts keyed by ``requestId`` (the ``provider_msg_id`` of the send, which
    :mod:`adapters.hms` records; ``biTag`` is our delivery id, not needed to match):
    status 0 DELIVERED, 27 skipped, any other UNDELIVERED with its meaning as the error.
    Only the body: the ``X-HUAWEI-CALLBACK-ID`` header (HMAC-SHA256 over timestamp,
    nonce and user name, not over the body) is for the endpoint to check
    (:meth:`ReceiptVerifier.hms`).

    A status's ``timestamp`` outside ``max_age`` / ``max_ahead`` is ``malformed``, or,
    with ``clamp``, taken as ``now``: Huawei documents it as the device's local time,
    and one phone's wrong clock must not refuse the other statuses of the callback."""
    if isinstance(body, (bytes, str)):
        try:
            body = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise ReceiptRejected("malformed", f"json: {exc}") from None
    items = body.get("statuses") if isinstance(body, Mapping) else None
    if not isinstance(items, list):
        raise ReceiptRejected("malformed", "statuses is not a list", field="statuses")
    ref = time.time() if now is None else now
    out: list[Receipt] = []
    for i, item in enumerate(items):
        where = f"statuses[{i}]."
        if not isinstance(item, Mapping):
            raise ReceiptRejected("malformed", "a status is not an object", field=where[:-1])
        msg_id, state = item.get("requestId"), item.get("status")
        if isinstance(msg_id, bool) or not isinstance(msg_id, (str, int)) or not str(msg_id).strip():
            raise ReceiptRejected("malformed", "requestId is not a string", field=where + "requestId")
        msg_id = str(msg_id).strip()
        if len(msg_id) > MAX_MSG_ID:
            raise ReceiptRejected("malformed", f"requestId longer than {MAX_MSG_ID}", field=where + "requestId")
        _msg_id_ok(msg_id, where + "requestId")
        if isinstance(state, bool) or not isinstance(state, (int, str)) or not str(state).strip().isdigit():
            raise ReceiptRejected("malformed", "status is not a number", field=where + "status")
        state = int(str(state).strip())
        if state in HMS_NOT_FINAL:
            continue
        ms = _unix_time(item.get("timestamp"))
        at = ms / 1000.0 if ms is not None else ref
        if (max_age is not None and at < ref - max_age) or (max_ahead is not None and at > ref + max_ahead):
            if clamp:
                at = ref
            else:
                raise ReceiptRejected("malformed", f"timestamp {at:.0f} is not within {max_age or 0:.0f} s before "
                                      f"and {max_ahead or 0:.0f} s after now (unix milliseconds)",
                                      field=where + "timestamp")
        if state == 0:
            out.append(Receipt(provider=provider, provider_msg_id=msg_id, status="DELIVERED", at=at))
        else:
            error = f"hms {state}: {HMS_RECEIPT_STATES.get(state, 'not delivered')}"[:MAX_ERROR]
            out.append(Receipt(provider=provider, provider_msg_id=msg_id, status="UNDELIVERED", at=at, error=error))
    return out


# ---------------------------------------------------------------- Huawei Push Kit: the callback's authentication

#: Push Kit's receipt callback authentication header (developer.huawei.com/consumer/en/doc/
#: doccenter-references/api/push-api-msg-receipt, "Request Header"): sent when the app's
#: receipt configuration in AppGallery Connect has both a callback user name and a callback
#: key: ``timestamp=<ms>; nonce=<UUID>; value=<base64(HMAC-SHA256(callback key,
#: timestamp + nonce + user name))>``. It does not cover the body (HTTPS protects it).
HMS_CALLBACK_HEADER = "X-HUAWEI-CALLBACK-ID"
#: the callback user name of the Push Kit simulator that ``notify run`` starts (its key:
#: ``NOTIFY_HMS_RECEIPT_KEY``), taken at ``/v1/receipts/hms`` when no provider of that name has a kind
HMS_SIM_USERNAME = "notify-sim"


def hms_callback_value(key: str | bytes, timestamp: str, nonce: str, username: str) -> str:
    """The ``value`` of an X-HUAWEI-CALLBACK-ID: base64(HMAC-SHA256(key, timestamp + nonce + user name))."""
    k = key.encode() if isinstance(key, str) else key
    mac = hmac.new(k, f"{timestamp}{nonce}{username}".encode(), hashlib.sha256)
    return base64.b64encode(mac.digest()).decode()


def hms_callback_id(key: str | bytes, username: str, timestamp: Optional[str] = None,
                    nonce: Optional[str] = None) -> str:
    """An X-HUAWEI-CALLBACK-ID header value as Push Kit sends it (the simulator's, the tests')."""
    import uuid

    ts = timestamp if timestamp is not None else str(int(time.time() * 1000))
    nonce = nonce if nonce is not None else str(uuid.uuid4())
    return f"timestamp={ts}; nonce={nonce}; value={hms_callback_value(key, ts, nonce, username)}"


def parse_hms_callback_id(header: Optional[str]) -> Optional[tuple[str, str, str]]:
    """``timestamp=…; nonce=…; value=…`` → ``(timestamp, nonce, value)``; None when one is missing."""
    fields: dict[str, str] = {}
    for part in (header or "").split(";"):
        name, sep, value = part.partition("=")  # the value's base64 padding stays in it
        if sep and name.strip().lower() in ("timestamp", "nonce", "value"):
            fields[name.strip().lower()] = value.strip()
    if not all(fields.get(k) for k in ("timestamp", "nonce", "value")):
        return None
    return fields["timestamp"], fields["nonce"], fields["value"]


def _hms_match(key: str | bytes, username: str, header: Optional[str]) -> Optional[tuple[str, str, str]]:
    """``(timestamp, nonce, the value we computed)`` when the header's value is the one
    the key and user name give (compared in constant time); else None."""
    parts = parse_hms_callback_id(header)
    if parts is None:
        return None
    ts, nonce, value = parts
    expected = hms_callback_value(key, ts, nonce, username)
    if not hmac.compare_digest(expected.encode(), value.encode("utf-8", "surrogatepass")):
        return None
    return ts, nonce, expected


def hms_receipt_config(providers: Optional[Mapping[str, Any]], name: str, *,
                       env: Optional[Mapping[str, str]] = None,
                       simulator_key: Optional[str] = None) -> Optional[dict[str, Any]]:
    """For ``POST /v1/receipts/<name>``: when ``[providers.<name>]`` is of kind hms, the
    :class:`ReceiptVerifier` arguments of its receipts (``hms_username``: its
    ``receipt_username``; ``hms_key``: its ``receipt_key_env`` / ``receipt_key_file``
    read from ``env`` (default: this process's environment) or the file; both None
    when the table gives none: its callbacks are then refused; ``hms_provider``: the
    name the receipts carry). For ``name`` "hms" with no table of a kind by that name
    and ``simulator_key`` (``NOTIFY_HMS_RECEIPT_KEY``, set by ``notify run`` for the
    simulators): the Push Kit simulator's user name and that key. Else None.
    Raises ConfigError (naming the key, never the secret) when the key is not readable."""
    import os

    from config.providers import resolve_secret

    spec = providers.get(name) if providers else None
    kind = getattr(spec, "kind", None)
    if kind == "hms":
        key = resolve_secret(spec, "receipt_key", os.environ if env is None else env)
        username = spec.options.get("receipt_username")  # type: ignore[union-attr]
        return {"hms_username": username, "hms_key": key, "hms_provider": name}
    if kind is None and name == "hms" and simulator_key:
        return {"hms_username": HMS_SIM_USERNAME, "hms_key": simulator_key, "hms_provider": name}
    return None


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
        twilio_shared_keys: Optional[Mapping[str, str]] = None,
        receipt_max_age: float = RECEIPT_MAX_AGE,
        receipt_max_ahead: float = RECEIPT_MAX_AHEAD,
        sendgrid_public_key: Optional[str] = None,
        sendgrid_provider: str = "sendgrid",
        sns_topic_arns: Sequence[str] = (),
        sns_cert_urls: Sequence[str] = (),
        sns_certs: Any = None,
        ses_provider: str = "ses",
        hms_username: Optional[str] = None,
        hms_key: Optional[str | bytes] = None,
        hms_provider: str = "hms",
    ) -> None:
        # Huawei Push Kit: the callback user name and key of the app's receipt configuration
        self.hms_username = hms_username
        self.hms_key = hms_key
        self.hms_provider = hms_provider
        # e-mail events (adapters/receipts_email.py): SendGrid's verification key (base64
        # DER or PEM); the SNS topics whose SES notifications are taken, extra certificate
        # URL prefixes (a simulator), the certificate cache (default: the process's)
        self.sendgrid_public_key = sendgrid_public_key
        self.sendgrid_provider = sendgrid_provider
        self.sns_topic_arns = tuple(sns_topic_arns)
        self.sns_cert_urls = tuple(sns_cert_urls)
        self.sns_certs = sns_certs
        self.ses_provider = ses_provider
        self.twilio_auth_token = twilio_auth_token
        #: SharedKey id → secret, for callbacks signed with a SharedKey
        #: (``X-Twilio-Webhooks-Signature-Settings: key=<id>,…``)
        self.twilio_shared_keys = dict(twilio_shared_keys or {})
        self.vendor_secret = vendor_secret
        self.guard: ReplayGuard = guard if guard is not None else MemoryReplayGuard()
        self.tolerance = tolerance
        self.twilio_replay_ttl = twilio_replay_ttl
        self._now = now
        self.twilio_provider = twilio_provider
        self.vendor_provider = vendor_provider
        self.receipt_max_age = receipt_max_age
        self.receipt_max_ahead = receipt_max_ahead

    def _twilio_secret(self, settings: Optional[str]) -> tuple[str, str]:
        """The secret and algorithm a callback names (``X-Twilio-Webhooks-Signature-Settings``):
        the SharedKey it names when we hold it, else the Auth Token."""
        key_id, algorithm = signature_settings(settings)
        secret = self.twilio_shared_keys.get(key_id) if key_id else None
        secret = secret or self.twilio_auth_token
        if not secret:
            raise ReceiptRejected("bad_signature", "no Twilio auth token configured")
        if algorithm not in _TWILIO_HASHES:
            raise ReceiptRejected("bad_signature", f"unsupported signature algorithm {algorithm[:40]!r}")
        return secret, algorithm

    async def _first(self, signature: str) -> bool:
        """Is this signed callback new? ``signature``: the one we computed and the
        callback's matched (so however its header was spelled, one callback is one
        key). An identical one again (Twilio retries a callback whose answer it
        did not get) is acknowledged, not written again."""
        key = "twilio:" + hashlib.sha256(signature.encode()).hexdigest()
        return await self.guard.first_seen(key, self.twilio_replay_ttl)

    async def twilio(
        self, url: str, params: Params, signature: Optional[str], *, settings: Optional[str] = None
    ) -> Optional[Receipt]:
        """A form-encoded status callback. ``url``: the full URL Twilio POSTed to
        (query string included: the signature covers it); ``params``: the form
        fields; ``settings``: the X-Twilio-Webhooks-Signature-Settings header.

        Accepts what twilio's ``RequestValidator`` accepts (the URL with or
        without its port, HMAC-SHA1 with the Auth Token or HMAC-SHA256 with a
        SharedKey). Returns the receipt, or None for a non-final status and for
        an identical callback seen before (already taken: answer 200)."""
        secret, algorithm = self._twilio_secret(settings)
        matched = _twilio_match(secret, url, params, signature, algorithm)
        if matched is None:
            raise ReceiptRejected("bad_signature", "X-Twilio-Signature mismatch")
        receipt = parse_twilio_callback(params, self.twilio_provider, now=self._now())
        if not await self._first(matched):
            return None
        return receipt

    async def twilio_json(
        self, url: str, body: bytes, signature: Optional[str], *, settings: Optional[str] = None
    ) -> Optional[Receipt]:
        """A JSON callback: the URL carries ``bodySHA256`` (hex SHA-256 of the
        body), and the signature covers the URL alone, as twilio's
        ``RequestValidator`` checks it."""
        expected = body_sha256(url)
        if expected is None:
            raise ReceiptRejected("bad_signature", "a JSON callback without bodySHA256")
        secret, algorithm = self._twilio_secret(settings)
        matched = _twilio_match(secret, url, [], signature, algorithm)
        if matched is None:
            raise ReceiptRejected("bad_signature", "X-Twilio-Signature mismatch")
        if not hmac.compare_digest(hashlib.sha256(body).hexdigest().encode(), expected.strip().lower().encode()):
            raise ReceiptRejected("bad_signature", "bodySHA256 does not match the body")
        receipt = parse_twilio_callback(_json_params(body), self.twilio_provider, now=self._now())
        if not await self._first(matched):
            return None
        return receipt

    async def twilio_request(
        self, url: str, content_type: Optional[str], body: bytes, headers: Mapping[str, str]
    ) -> Optional[Receipt]:
        """A Twilio callback as an HTTP endpoint received it: the full URL
        called, the Content-Type, the raw body and the headers. A form is
        checked by :meth:`twilio`; anything else with ``bodySHA256`` in the URL
        by :meth:`twilio_json`."""
        signature = _header(headers, "X-Twilio-Signature")
        settings = _header(headers, SIGNATURE_SETTINGS_HEADER)
        ctype = (content_type or "").split(";", 1)[0].strip().lower()
        if ctype != "application/x-www-form-urlencoded" and body_sha256(url) is not None:
            return await self.twilio_json(url, body, signature, settings=settings)
        return await self.twilio(url, parse_form(body), signature, settings=settings)

    async def vendor(self, body: bytes, timestamp: Optional[str], signature: Optional[str]) -> list[Receipt]:
        """``timestamp``/``signature``: the X-Vendor-Timestamp / X-Vendor-Signature headers."""
        if self.vendor_secret is None:
            raise ReceiptRejected("bad_signature", "no vendor secret configured")
        digest = _vendor_match(self.vendor_secret, timestamp, body, signature)
        if digest is None:
            raise ReceiptRejected("bad_signature", "X-Vendor-Signature mismatch")
        ts = _unix_time(str(timestamp).strip())
        if ts is None:  # "nan" would pass any comparison: never a valid time
            raise ReceiptRejected("malformed", "timestamp is not a unix time")
        if abs(self._now() - ts) > self.tolerance:
            raise ReceiptRejected("stale", f"timestamp {ts:.0f} outside ±{self.tolerance:.0f}s")
        # the digest we computed, not the header's spelling: " sha256= <HEX> " is the same callback
        key = "vendor:sha256=" + digest
        receipts = parse_vendor_callback(body, self.vendor_provider, now=self._now(),
                                         max_age=self.receipt_max_age, max_ahead=self.receipt_max_ahead)
        if not await self.guard.first_seen(key, 2 * self.tolerance):
            raise ReceiptRejected("replay", "signature seen before")
        return receipts

    async def sendgrid(self, body: bytes, signature: Optional[str], timestamp: Optional[str]) -> list[Receipt]:
        """SendGrid's signed Event Webhook: ``signature`` / ``timestamp`` are the
        X-Twilio-Email-Event-Webhook-Signature / -Timestamp headers (ECDSA P-256 over
        timestamp + body, :func:`adapters.receipts_email.verify_sendgrid_signature`).
        A timestamp further than ``tolerance`` from now is ``stale``; the same signed
        payload again is acknowledged (``[]``) and not written twice."""
        from .receipts_email import parse_sendgrid_events, verify_sendgrid_signature

        if not self.sendgrid_public_key:
            raise ReceiptRejected("bad_signature", "no SendGrid verification key configured")
        try:
            ok = verify_sendgrid_signature(self.sendgrid_public_key, body, signature, timestamp)
        except ValueError as exc:  # the configured key is not an EC public key
            raise ReceiptRejected("bad_signature", f"SendGrid verification key: {exc}") from None
        if not ok:
            raise ReceiptRejected("bad_signature", "X-Twilio-Email-Event-Webhook-Signature mismatch")
        ts = _unix_time(str(timestamp).strip())
        if ts is None:
            raise ReceiptRejected("malformed", "timestamp is not a unix time")
        if abs(self._now() - ts) > self.tolerance:
            raise ReceiptRejected("stale", f"timestamp {ts:.0f} outside ±{self.tolerance:.0f}s")
        receipts = parse_sendgrid_events(body, self.sendgrid_provider, now=self._now(),
                                         max_age=self.receipt_max_age, max_ahead=self.receipt_max_ahead)
        # what was signed, not the signature (ECDSA signatures differ for the same payload)
        key = "sendgrid:" + hashlib.sha256(str(timestamp).strip().encode() + b"." + body).hexdigest()
        if not await self.guard.first_seen(key, 2 * self.tolerance):
            return []
        return receipts

    async def hms(self, body: bytes, callback_id: Optional[str]) -> list[Receipt]:
        """A Huawei Push Kit receipt callback: ``callback_id`` is its X-HUAWEI-CALLBACK-ID
        header (:data:`HMS_CALLBACK_HEADER`), checked against the configured callback user
        name and key (constant time; neither configured: every callback is refused, Push
        Kit sends no header then); its timestamp (milliseconds; seconds are taken too)
        further than ``tolerance`` from now is ``stale``. The header does not cover the
        body, so each header is taken once (the same header again with another body is a
        ``replay``), and the same body again, whatever its header (Push Kit's retry), is
        acknowledged (``[]``) and not written twice. A status dated by a device clock out
        of bounds is taken as of now (:func:`parse_hms_receipts` ``clamp``)."""
        if not self.hms_username or not self.hms_key:
            raise ReceiptRejected("bad_signature", "no receipt callback user name and key configured")
        matched = _hms_match(self.hms_key, self.hms_username, callback_id)
        if matched is None:
            raise ReceiptRejected("bad_signature", f"{HMS_CALLBACK_HEADER} mismatch")
        ts_text, _nonce, value = matched
        ts = _unix_time(ts_text)
        if ts is None:
            raise ReceiptRejected("malformed", "timestamp is not a unix time")
        ts = ts / 1000.0 if ts > 1e11 else ts  # Huawei documents milliseconds (older pages: seconds)
        if abs(self._now() - ts) > self.tolerance:
            raise ReceiptRejected("stale", f"timestamp {ts:.0f} outside ±{self.tolerance:.0f}s")
        receipts = parse_hms_receipts(body, self.hms_provider, now=self._now(), max_age=self.receipt_max_age,
                                      max_ahead=self.receipt_max_ahead, clamp=True)
        digest = hashlib.sha256(self.hms_provider.encode() + b"\n" + body).hexdigest()
        if not await self.guard.first_seen("hms:body:" + digest, self.twilio_replay_ttl):
            return []
        if not await self.guard.first_seen("hms:id:" + hashlib.sha256(value.encode()).hexdigest(),
                                           2 * self.tolerance):
            raise ReceiptRejected("replay", f"{HMS_CALLBACK_HEADER} seen before")
        return receipts

    async def sns(self, body: bytes) -> list[Receipt]:
        """An Amazon SNS message (an HTTPS subscription of a topic SES publishes to),
        verified (:func:`adapters.receipts_email.verify_sns_signature`; the topic must
        be one of ``sns_topic_arns``). A SubscriptionConfirmation is confirmed (its
        SubscribeURL fetched) and gives ``[]``; a Notification gives the receipt of the
        SES event inside; the same MessageId again is acknowledged (``[]``)."""
        from .receipts_email import (DEFAULT_CERTS, SNS_TYPES, parse_ses_event, sns_url_allowed,
                                     verify_sns_signature)

        try:
            msg = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise ReceiptRejected("malformed", f"json: {exc}") from None
        if not isinstance(msg, dict) or msg.get("Type") not in SNS_TYPES:
            raise ReceiptRejected("malformed", "not an SNS message (Type)", field="Type")
        topic = msg.get("TopicArn")
        if not self.sns_topic_arns:
            raise ReceiptRejected("bad_signature", "no SNS topic configured (sns_topic_arns)")
        if topic not in self.sns_topic_arns:
            raise ReceiptRejected("bad_signature", "TopicArn is not a configured topic")
        await verify_sns_signature(msg, self.sns_certs or DEFAULT_CERTS, self.sns_cert_urls)
        if msg["Type"] == "UnsubscribeConfirmation":
            return []
        if msg["Type"] == "SubscriptionConfirmation":
            url = msg.get("SubscribeURL")
            if not sns_url_allowed(url, self.sns_cert_urls, pem=False):
                raise ReceiptRejected("bad_signature", "SubscribeURL is not an https URL of sns.<region>.amazonaws.com")
            try:
                await (self.sns_certs or DEFAULT_CERTS).fetch(str(url))
            except Exception as exc:  # noqa: BLE001 - SNS sends the confirmation again
                raise ReceiptRejected("malformed", f"confirming the subscription: {type(exc).__name__}: {exc}"[:200]) \
                    from None
            return []
        ts = _iso_time(msg.get("Timestamp"))
        if ts is None:
            raise ReceiptRejected("malformed", "Timestamp is not an ISO 8601 time", field="Timestamp")
        if ts < self._now() - self.receipt_max_age or ts > self._now() + self.receipt_max_ahead:
            raise ReceiptRejected("stale", f"Timestamp {msg.get('Timestamp')!s:.40} is too old or ahead")
        receipts = parse_ses_event(msg.get("Message") or "", self.ses_provider, now=self._now(),
                                   max_age=self.receipt_max_age, max_ahead=self.receipt_max_ahead)
        if not await self.guard.first_seen("sns:" + str(msg.get("MessageId")), self.twilio_replay_ttl):
            return []
        return receipts


def _iso_time(value: Any) -> Optional[float]:
    from datetime import datetime

    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
