"""Signed e-mail event callbacks: SendGrid's Event Webhook and Amazon SNS
notifications (SES bounces, complaints and deliveries), verified and parsed into
:class:`pipeline.models.Receipt` records. :class:`adapters.receipts.ReceiptVerifier`
calls these (``sendgrid``, ``sns``) with its replay guard and clock.

**SendGrid** (Signed Event Webhook): ``X-Twilio-Email-Event-Webhook-Signature``
is base64(DER(ECDSA P-256 / SHA-256 over ``timestamp + payload``)), the
timestamp in ``X-Twilio-Email-Event-Webhook-Timestamp``, verified with the
account's verification key (base64 DER of the public key, as SendGrid shows it
under Mail Settings; a PEM works too): :func:`verify_sendgrid_signature`, the
same check as sendgrid's own ``EventWebhook.verify_signature`` (the tests use it
as the judge). The payload is a JSON array of events; ``sg_message_id`` starts
with the ``X-Message-Id`` the send answered (``<id>.filter…``): that prefix is
the receipt's message id. ``delivered``, ``open``, ``click`` and ``spamreport``
(the mail reached the mailbox) give DELIVERED; ``bounce`` (``type`` bounce or
blocked) and ``dropped`` give UNDELIVERED; ``processed`` and ``deferred`` give
nothing. ``spamreport``, ``unsubscribe`` and ``group_unsubscribe`` (the recipient
used SendGrid's own unsubscribe link: the mail reached them too, DELIVERED) are
opt-outs (``Receipt.opt_out``: the receipts agent switches the delivery's
category off on e-mail).

**Amazon SNS** (an HTTPS subscription of the topic SES publishes to): the JSON
body's ``Signature`` is base64(RSA PKCS#1 v1.5 over the canonical string),
SHA-1 for ``SignatureVersion`` 1 and SHA-256 for 2; the canonical string is
``name\\nvalue\\n`` for ``Message``, ``MessageId``, ``Subject`` (when present),
``Timestamp``, ``TopicArn``, ``Type`` (a Notification) or ``Message``,
``MessageId``, ``SubscribeURL``, ``Timestamp``, ``Token``, ``TopicArn``, ``Type``
(a SubscriptionConfirmation / UnsubscribeConfirmation). The certificate is
fetched from ``SigningCertURL`` only when it is an ``https://`` URL on
``sns.<region>.amazonaws.com`` (``.amazonaws.com.cn``) ending ``.pem``, or starts
with one of the configured extra prefixes (a simulator), and cached. A message of
a topic not configured (``sns_topic_arns``) is refused: anyone can publish to a
topic of their own and have it signed by SNS. A SubscriptionConfirmation of a
configured topic is confirmed by fetching its ``SubscribeURL`` (checked as the
certificate URL is). The Notification's ``Message`` is SES's event (an identity
notification, ``notificationType``, or a configuration set's event,
``eventType``): ``Delivery``, ``Complaint``, ``Open`` and ``Click`` give
DELIVERED, ``Bounce``, ``Reject`` and ``RenderingFailure`` give UNDELIVERED, for
``mail.messageId`` (the SendEmail MessageId); a ``Complaint`` is an opt-out
(``Receipt.opt_out``).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import re
import time
from collections import OrderedDict
from typing import Any, Awaitable, Callable, Iterable, Mapping, Optional, Union
from urllib.parse import urlsplit

import orjson
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.serialization import load_der_public_key, load_pem_public_key

from pipeline.models import Receipt
from pipeline.parsers.events import MAX_PROVIDER_MSG_ID as MAX_MSG_ID
from pipeline.parsers.events import id_problem

from .receipts import ReceiptRejected, _iso_time, _unix_time

__all__ = [
    "SENDGRID_SIGNATURE_HEADER", "SENDGRID_TIMESTAMP_HEADER", "load_sendgrid_key", "verify_sendgrid_signature",
    "parse_sendgrid_events", "sns_string_to_sign", "sns_url_allowed", "SnsCertCache", "verify_sns_signature",
    "parse_ses_event", "SNS_CERT_HOST",
]

SENDGRID_SIGNATURE_HEADER = "X-Twilio-Email-Event-Webhook-Signature"
SENDGRID_TIMESTAMP_HEADER = "X-Twilio-Email-Event-Webhook-Timestamp"
MAX_ERROR = 200



def _rejected(reason: str, detail: str = "", field: Optional[str] = None) -> Exception:
    return ReceiptRejected(reason, detail, field=field)


# ---------------------------------------------------------------- SendGrid


def load_sendgrid_key(key: Union[str, bytes, ec.EllipticCurvePublicKey]) -> ec.EllipticCurvePublicKey:
    """The Event Webhook verification key: base64 DER (as SendGrid shows it), a PEM,
    or a key object. ValueError when it is none of these or not an EC key."""
    if isinstance(key, ec.EllipticCurvePublicKey):
        return key
    text = key.decode() if isinstance(key, bytes) else str(key)
    text = text.strip()
    if "-----BEGIN" in text:
        loaded = load_pem_public_key(text.encode())
    else:
        try:
            der = base64.b64decode("".join(text.split()), validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("not base64 (the verification key SendGrid shows) nor a PEM") from None
        loaded = load_der_public_key(der)
    if not isinstance(loaded, ec.EllipticCurvePublicKey):
        raise ValueError(f"a {type(loaded).__name__.lstrip('_')}, not an EC public key")
    return loaded


def verify_sendgrid_signature(public_key: Union[str, ec.EllipticCurvePublicKey], payload: bytes,
                              signature: Optional[str], timestamp: Optional[str]) -> bool:
    """ECDSA P-256 / SHA-256 over ``timestamp + payload`` (the raw body, byte for byte),
    the signature base64 DER."""
    if not signature or timestamp is None:
        return False
    try:
        sig = base64.b64decode(signature.strip(), validate=True)
    except (binascii.Error, ValueError):
        return False
    try:
        load_sendgrid_key(public_key).verify(sig, timestamp.encode() + payload, ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError):
        return False
    return True


_SG_FINAL = {"delivered": "DELIVERED", "open": "DELIVERED", "click": "DELIVERED", "spamreport": "DELIVERED",
             "unsubscribe": "DELIVERED", "group_unsubscribe": "DELIVERED",
             "bounce": "UNDELIVERED", "dropped": "UNDELIVERED", "blocked": "UNDELIVERED"}
#: the events by which a recipient opts out (Receipt.opt_out)
_SG_OPT_OUT = frozenset({"spamreport", "unsubscribe", "group_unsubscribe"})


def _msg_id(value: Any, field: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _rejected("malformed", f"{field}: missing or not a string", field=field)
    value = value.strip()
    if len(value) > MAX_MSG_ID:
        raise _rejected("malformed", f"{field} longer than {MAX_MSG_ID}", field=field)
    problem = id_problem(value)
    if problem is not None:
        raise _rejected("malformed", f"{field}: {problem}", field=field)
    return value


def _at(t: Optional[float], now: float, max_age: Optional[float], max_ahead: Optional[float], field: str) -> float:
    if t is None:
        return now
    if (max_age is not None and t < now - max_age) or (max_ahead is not None and t > now + max_ahead):
        raise _rejected("malformed", f"{field} {t:.0f} is not within {max_age or 0:.0f} s before and "
                        f"{max_ahead or 0:.0f} s after now (unix seconds)", field=field)
    return t


def parse_sendgrid_events(body: Union[bytes, str, list], provider: str = "sendgrid", now: Optional[float] = None, *,
                          max_age: Optional[float] = None, max_ahead: Optional[float] = None) -> list[Receipt]:
    """An Event Webhook payload (a JSON array of events) → Receipts for the final ones."""
    if isinstance(body, (bytes, str)):
        try:
            body = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise _rejected("malformed", f"json: {exc}") from None
    if not isinstance(body, list):
        raise _rejected("malformed", "not a JSON array of events")
    ref = time.time() if now is None else now
    out: list[Receipt] = []
    for i, ev in enumerate(body):
        if not isinstance(ev, Mapping):
            raise _rejected("malformed", f"[{i}] is not an object", field=f"[{i}]")
        kind = ev.get("event")
        if not isinstance(kind, str):
            raise _rejected("malformed", f"[{i}].event is not a string", field=f"[{i}].event")
        final = _SG_FINAL.get(kind.lower())
        if final is None:
            continue
        sg_id = _msg_id(ev.get("sg_message_id"), f"[{i}].sg_message_id")
        msg_id = sg_id.split(".", 1)[0]
        at = _at(_unix_time(ev.get("timestamp")), ref, max_age, max_ahead, f"[{i}].timestamp")
        error = None
        if final == "UNDELIVERED":
            reason = ev.get("reason") or ev.get("response") or ""
            what = kind.lower() if kind.lower() != "bounce" else f"bounce {ev.get('type') or ''}".strip()
            error = (f"{what}: {reason}" if isinstance(reason, str) and reason else what)[:MAX_ERROR]
        elif kind.lower() in _SG_OPT_OUT:
            error = kind.lower()
        out.append(Receipt(provider=provider, provider_msg_id=msg_id, status=final, at=at, error=error,
                           opt_out=kind.lower() in _SG_OPT_OUT))
    return out


# ---------------------------------------------------------------- Amazon SNS

#: where SNS's signing certificates are served (AWS's own SDKs check the same)
SNS_CERT_HOST = re.compile(r"^sns\.[a-z0-9-]{3,}\.amazonaws\.com(\.cn)?$")
_NOTIFICATION_KEYS = ("Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type")
_CONFIRMATION_KEYS = ("Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type")
SNS_TYPES = ("Notification", "SubscriptionConfirmation", "UnsubscribeConfirmation")


def sns_string_to_sign(msg: Mapping[str, Any]) -> bytes:
    """The canonical string an SNS message's signature covers."""
    kind = msg.get("Type")
    keys = _NOTIFICATION_KEYS if kind == "Notification" else _CONFIRMATION_KEYS
    parts = []
    for k in keys:
        v = msg.get(k)
        if v is None:
            if k == "Subject":
                continue
            raise _rejected("malformed", f"{k} missing", field=k)
        if not isinstance(v, str):
            raise _rejected("malformed", f"{k} is not a string", field=k)
        parts.append(f"{k}\n{v}\n")
    return "".join(parts).encode()


def sns_url_allowed(url: Any, extra_prefixes: Iterable[str] = (), *, pem: bool = True) -> bool:
    """An ``https://sns.<region>.amazonaws.com/…`` URL (``….pem`` for a certificate),
    or one starting with a configured prefix."""
    if not isinstance(url, str) or not url:
        return False
    for prefix in extra_prefixes:
        if prefix and url.startswith(prefix):
            return True
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return False
    if parts.scheme != "https" or port not in (None, 443) or parts.username or parts.password:
        return False
    if not SNS_CERT_HOST.match(parts.hostname or ""):
        return False
    return parts.path.endswith(".pem") if pem else True


Fetch = Callable[[str], Awaitable[bytes]]


async def _aiohttp_get(url: str) -> bytes:
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        async with session.get(url, allow_redirects=False) as resp:
            if resp.status != 200:
                raise OSError(f"GET {url}: {resp.status}")
            return await resp.content.read(64 * 1024)


class SnsCertCache:
    """Signing certificates by URL: fetched once (concurrent requests share the fetch),
    kept ``ttl`` seconds, at most ``max_entries``."""

    def __init__(self, fetch: Fetch = _aiohttp_get, *, ttl: float = 86400.0, max_entries: int = 32,
                 now: Callable[[], float] = time.monotonic) -> None:
        self.fetch = fetch
        self.ttl = ttl
        self.max_entries = max_entries
        self._now = now
        self._keys: OrderedDict[str, tuple[float, rsa.RSAPublicKey]] = OrderedDict()
        self._pending: dict[str, asyncio.Future] = {}
        self.fetches = 0

    async def public_key(self, url: str) -> rsa.RSAPublicKey:
        hit = self._keys.get(url)
        if hit is not None and hit[0] > self._now():
            return hit[1]
        pending = self._pending.get(url)
        if pending is not None:
            return await asyncio.shield(pending)
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._pending[url] = fut
        try:
            self.fetches += 1
            pem = await self.fetch(url)
            key = x509.load_pem_x509_certificate(pem).public_key()
            if not isinstance(key, rsa.RSAPublicKey):
                raise ValueError("the certificate's key is not RSA")
            self._keys[url] = (self._now() + self.ttl, key)
            while len(self._keys) > self.max_entries:
                self._keys.popitem(last=False)
            fut.set_result(key)
            return key
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()  # retrieved: no "never retrieved" warning when nobody else waits
            raise
        finally:
            self._pending.pop(url, None)


#: the process's certificate cache (the API builds a verifier per request)
DEFAULT_CERTS = SnsCertCache()
_HASH = {"1": hashes.SHA1, "2": hashes.SHA256}


async def verify_sns_signature(msg: Mapping[str, Any], certs: SnsCertCache,
                               extra_prefixes: Iterable[str] = ()) -> None:
    """Raises ReceiptRejected ``bad_signature`` unless ``msg`` is signed by SNS."""
    version = str(msg.get("SignatureVersion") or "")
    if version not in _HASH:
        raise _rejected("bad_signature", f"SignatureVersion {version[:8]!r} (1 or 2 expected)")
    url = msg.get("SigningCertURL")
    if not sns_url_allowed(url, extra_prefixes):
        raise _rejected("bad_signature", "SigningCertURL is not an https URL of sns.<region>.amazonaws.com")
    try:
        sig = base64.b64decode(str(msg.get("Signature") or ""), validate=True)
    except (binascii.Error, ValueError):
        raise _rejected("bad_signature", "Signature is not base64") from None
    canonical = sns_string_to_sign(msg)
    try:
        key = await certs.public_key(str(url))
    except Exception as exc:  # noqa: BLE001 - unreachable, not a certificate
        raise _rejected("bad_signature", f"signing certificate: {type(exc).__name__}") from None
    try:
        key.verify(sig, canonical, padding.PKCS1v15(), _HASH[version]())
    except InvalidSignature:
        raise _rejected("bad_signature", "SNS signature mismatch") from None


_SES_FINAL = {"Delivery": "DELIVERED", "Complaint": "DELIVERED", "Open": "DELIVERED", "Click": "DELIVERED",
              "Bounce": "UNDELIVERED", "Reject": "UNDELIVERED", "RenderingFailure": "UNDELIVERED"}
_SES_DETAIL = {"Delivery": "delivery", "Complaint": "complaint", "Open": "open", "Click": "click",
               "Bounce": "bounce", "Reject": "reject", "RenderingFailure": "failure"}


def parse_ses_event(message: Union[str, bytes, Mapping[str, Any]], provider: str = "ses",
                    now: Optional[float] = None, *, max_age: Optional[float] = None,
                    max_ahead: Optional[float] = None) -> list[Receipt]:
    """SES's event (an SNS Notification's ``Message``) → at most one Receipt."""
    if isinstance(message, (str, bytes)):
        try:
            message = orjson.loads(message)
        except orjson.JSONDecodeError as exc:
            raise _rejected("malformed", f"Message: json: {exc}", field="Message") from None
    if not isinstance(message, Mapping):
        raise _rejected("malformed", "Message is not a JSON object", field="Message")
    kind = message.get("notificationType") or message.get("eventType")
    if not isinstance(kind, str):
        raise _rejected("malformed", "Message: no notificationType / eventType", field="Message.notificationType")
    final = _SES_FINAL.get(kind)
    if final is None:  # Send, DeliveryDelay, Subscription, AmazonSnsSubscriptionSucceeded, …
        return []
    mail = message.get("mail")
    if not isinstance(mail, Mapping):
        raise _rejected("malformed", "Message: no mail object", field="Message.mail")
    msg_id = _msg_id(mail.get("messageId"), "Message.mail.messageId")
    detail = message.get(_SES_DETAIL[kind])
    detail = detail if isinstance(detail, Mapping) else {}
    ref = time.time() if now is None else now
    t = _iso_time(detail.get("timestamp")) or _iso_time(mail.get("timestamp"))
    at = _at(t, ref, max_age, max_ahead, "Message.timestamp")
    error = None
    if kind == "Bounce":
        recips = detail.get("bouncedRecipients")
        diag = ""
        if isinstance(recips, list) and recips and isinstance(recips[0], Mapping):
            diag = str(recips[0].get("diagnosticCode") or recips[0].get("status") or "")
        error = f"bounce {detail.get('bounceType') or ''}/{detail.get('bounceSubType') or ''}".rstrip("/")
        error = (f"{error}: {diag}" if diag else error)[:MAX_ERROR]
    elif kind == "Complaint":
        error = f"complaint {detail.get('complaintFeedbackType') or ''}".strip()[:MAX_ERROR]
    elif final == "UNDELIVERED":
        error = f"{kind.lower()}: {detail.get('reason') or detail.get('errorMessage') or ''}".rstrip(": ")[:MAX_ERROR]
    return [Receipt(provider=provider, provider_msg_id=msg_id, status=final, at=at, error=error,
                    opt_out=kind == "Complaint")]


# ---------------------------------------------------------------- the receipts endpoint

#: provider kinds whose receipts ``POST /v1/receipts/<name>`` takes, by a provider's name
EMAIL_KINDS = ("sendgrid", "ses")


def email_receipt_config(providers: Mapping[str, Any], name: str) -> Optional[dict[str, Any]]:
    """For ``POST /v1/receipts/<name>``: when ``[providers.<name>]`` is of kind sendgrid
    or ses, ``{"scheme": kind, "verifier": ReceiptVerifier arguments}`` (its
    verification key, its SNS topics and extra certificate URL prefixes; the receipts
    carry ``name``, the provider its deliveries were sent through); else None."""
    spec = providers.get(name) if providers else None
    kind = getattr(spec, "kind", None)
    if kind not in EMAIL_KINDS:
        return None
    o = spec.options  # type: ignore[union-attr]
    if kind == "sendgrid":
        return {"scheme": kind, "verifier": {"sendgrid_public_key": o.get("event_webhook_public_key"),
                                             "sendgrid_provider": name}}
    return {"scheme": kind, "verifier": {"sns_topic_arns": tuple(o.get("sns_topic_arns") or ()),
                                         "sns_cert_urls": tuple(o.get("sns_cert_urls") or ()),
                                         "ses_provider": name}}


async def email_receipts(verifier: Any, scheme: str, body: bytes, headers: Mapping[str, str]) -> list[Receipt]:
    """The receipts of one e-mail event callback as the endpoint received it."""
    if scheme == "sendgrid":
        return await verifier.sendgrid(body, headers.get(SENDGRID_SIGNATURE_HEADER),
                                       headers.get(SENDGRID_TIMESTAMP_HEADER))
    return await verifier.sns(body)
