"""Recipients never reach a log in clear: phone numbers, e-mail addresses, push
tokens and API keys are masked.

Helpers for code that logs a recipient on purpose::

    mask_phone("+15550001234")        → "+15*******34"
    mask_email("alice@example.com")   → "a***@example.com"
    mask_token("f0e1…64 hex…")        → "f0e1…(64)"
    mask_address("push", "apns:f0e1…") → "apns:f0e1…(64)"

and a net under everything else: :func:`install` wraps the log record factory,
so the message of every record (from any logger: ours, Faust's, aiohttp's),
its formatted traceback and stack are passed through :func:`redact` before any
handler sees them. :func:`redact` masks in free text: phone numbers (``+`` and
6–15 digits, or a bare run of 7–15 digits that is not part of a decimal
number), e-mail addresses, ``apns:``/``fcm:``/``hms:`` addresses, runs of 64 hex digits
(APNs tokens), long base64url runs (FCM tokens), ``nfk_…`` API keys,
``Bearer`` credentials, and URLs (cut to scheme and host: a webhook URL's path
and query are often its secret, and httpx logs every request's URL).
:class:`RedactingFilter` does the same as a ``logging.Filter`` for handlers set
up elsewhere.

Dead letters (``notify.dlq``) are masked the same way (:func:`mask_dead_letter`,
applied by :func:`pipeline.entries.send_dead_letter` when one is written, and
by ``notify dlq ls`` and the status page when one is shown): the detail, the
key and the reason are free text (:func:`mask_text`, as :func:`redact`); a
payload's address fields (``phone``, ``email``, ``webhook_url``, ``token``,
``address``) are masked by kind, its other text (keys included) as free text. The payload of a letter ``notify dlq replay`` sends
again (sources in :data:`REPLAYABLE`: an event, a failed delivery, whose
address the replay needs) is kept whole in the stream, and masked only where
it is shown.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any, Optional
from urllib.parse import urlsplit

__all__ = ["mask_phone", "mask_email", "mask_token", "mask_address", "mask_url", "redact", "mask_text",
           "mask_payload", "mask_dead_letter", "mask_letter_text", "REPLAYABLE", "RedactingFilter", "install"]

#: dead-letter sources whose payload ``notify dlq replay`` sends again as it is
REPLAYABLE = ("expand", "lane")

_EMAIL_RE = re.compile(r"([A-Za-z0-9._%+\-]{1,64})@([A-Za-z0-9\-]+(?:\.[A-Za-z0-9\-]+)+)")
_PUSH_RE = re.compile(r"\b(apns|fcm|hms):([A-Za-z0-9_\-:.]{8,})")
_API_KEY_RE = re.compile(r"\bnfk_([0-9a-f]{12})_[A-Za-z0-9_\-]+")
_BEARER_RE = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=\-]{6,}")
_HEX_TOKEN_RE = re.compile(r"(?<![0-9A-Za-z])[0-9a-fA-F]{64}(?![0-9A-Za-z])")
_LONG_TOKEN_RE = re.compile(r"(?<![A-Za-z0-9_\-:])[A-Za-z0-9_\-:]{100,}(?![A-Za-z0-9_\-:])")
_PLUS_PHONE_RE = re.compile(r"(?<![\w+])\+\d(?:[ ().\-]{0,2}\d){5,14}(?!\d)")
_BARE_PHONE_RE = re.compile(r"(?<![\w.+])\d{7,15}(?![\w.])")
_URL_RE = re.compile(r"(?i)\b[a-z][a-z0-9+.\-]{1,15}://[^\s\"'<>]*[^\s\"'<>),.;:!?\]]")


def mask_phone(phone: Any) -> str:
    s = str(phone or "")
    digits = re.sub(r"\D", "", s)
    if len(digits) < 4:
        return "***"
    head = ("+" if s.strip().startswith("+") else "") + digits[:2]
    return head + "*" * (len(digits) - 4) + digits[-2:]


def mask_email(email: Any) -> str:
    s = str(email or "")
    local, at, domain = s.rpartition("@")
    if not at:
        return mask_token(s)
    return (local[:1] or "") + "***@" + domain


def mask_token(token: Any) -> str:
    s = str(token or "")
    if len(s) <= 8:
        return "***"
    return f"{s[:4]}…({len(s)})"


def mask_address(channel: str, address: Any) -> str:
    """A delivery's address as it may appear in a log."""
    s = str(address or "")
    if not s:
        return ""
    if channel == "sms":
        return mask_phone(s)
    if channel == "email":
        return mask_email(s)
    if channel == "push":
        platform, sep, token = s.partition(":")
        return f"{platform}:{mask_token(token)}" if sep else mask_token(s)
    if channel == "webhook":
        return mask_url(s)
    return redact(s)


def mask_url(url: Any) -> str:
    """A URL as scheme and host (``https://hooks.example/…``): the path and the
    query of a webhook URL often are its secret (``/services/T0/B0/XyZ``,
    ``?token=…``), credentials in it always are."""
    s = str(url or "")
    try:
        parts = urlsplit(s)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return mask_token(s)
    if not parts.scheme or not host:
        return mask_token(s)
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc += f":{port}"
    rest = "/…" if (parts.path not in ("", "/") or parts.query or parts.fragment or parts.username) else ""
    return f"{parts.scheme}://{redact(netloc)}{rest}"


def redact(text: str) -> str:
    """``text`` with every recipient-like value masked (see the module doc)."""
    if not text:
        return text
    if "://" in text:
        text = _URL_RE.sub(lambda m: mask_url(m.group(0)), text)
    text = _BEARER_RE.sub(lambda m: f"{m.group(1)} ***", text)
    text = _API_KEY_RE.sub(lambda m: f"nfk_{m.group(1)}_***", text)
    text = _PUSH_RE.sub(lambda m: f"{m.group(1)}:{mask_token(m.group(2))}", text)
    text = _EMAIL_RE.sub(lambda m: mask_email(m.group(0)), text)
    text = _HEX_TOKEN_RE.sub(lambda m: mask_token(m.group(0)), text)
    text = _LONG_TOKEN_RE.sub(lambda m: mask_token(m.group(0)), text)
    text = _PLUS_PHONE_RE.sub(lambda m: mask_phone(m.group(0)), text)
    text = _BARE_PHONE_RE.sub(lambda m: mask_phone(m.group(0)), text)
    return text


def mask_text(text: Any) -> Any:
    """Free text of a dead letter (a detail, a key, a reason, a payload that is not
    JSON): :func:`redact`, as a log line; anything that is not text as it is."""
    if not isinstance(text, str) or not text:
        return text
    return redact(text)


_ADDRESS_FIELDS = {"phone": "sms", "to": "sms", "email": "email", "webhook_url": "webhook", "token": "push",
                   "device_token": "push"}


def _mask_json(obj: Any, channel: Optional[str] = None) -> Any:
    if isinstance(obj, dict):
        ch = obj.get("channel") if isinstance(obj.get("channel"), str) else channel
        out = {}
        for k, v in obj.items():
            kind = _ADDRESS_FIELDS.get(k.lower()) if isinstance(k, str) else None
            if isinstance(v, str) and v and k == "address":
                out[k] = mask_address(ch or "", v) if ch in ("sms", "email", "push", "webhook") else _mask_any(v)
            elif isinstance(v, str) and v and kind is not None:
                out[k] = mask_address(kind, v) if kind != "push" else mask_token(v)
            else:
                out[mask_text(k) if isinstance(k, str) else k] = _mask_json(v, ch)
        return out
    if isinstance(obj, list):
        return [_mask_json(v, channel) for v in obj]
    if isinstance(obj, str):
        return mask_text(obj)
    return obj


def _mask_any(value: str) -> str:
    """An address of an unknown channel: as a URL, an e-mail address, a push
    address, a phone number, or a token, whichever it looks like."""
    if "://" in value:
        return mask_url(value)
    if "@" in value:
        return mask_email(value)
    masked = mask_text(value)
    return masked if masked != value else mask_token(value)


def mask_payload(text: Any) -> Any:
    """A dead letter's payload with its addresses masked: a JSON document field by
    field (address fields by kind, the rest as free text), anything else as free
    text (:func:`mask_text`)."""
    if not isinstance(text, str) or not text:
        return text
    try:
        doc = json.loads(text)
    except ValueError:
        return mask_text(text)
    return json.dumps(_mask_json(doc), ensure_ascii=False, separators=(",", ":"))


def mask_dead_letter(letter: Any) -> Any:
    """A dead letter (its JSON object) as a person may see it: detail, key and
    reason as free text, the payload masked (:func:`mask_payload`)."""
    if not isinstance(letter, dict):
        return _mask_json(letter)
    out = dict(letter)
    for name in ("detail", "key", "reason", "source"):
        if name in out:
            out[name] = mask_text(out[name])
    if "payload" in out:
        out["payload"] = mask_payload(out["payload"])
    return out


def mask_letter_text(raw: Any) -> str:
    """One ``notify.dlq`` entry's value (bytes or text) → its masked JSON text."""
    if raw is None:
        return "null"
    text = bytes(raw).decode("utf-8", "replace") if isinstance(raw, (bytes, bytearray, memoryview)) else str(raw)
    try:
        letter = json.loads(text)
    except ValueError:
        return mask_text(text)
    return json.dumps(mask_dead_letter(letter), ensure_ascii=False, separators=(", ", ": "))


def _scrub(record: logging.LogRecord) -> None:
    try:
        msg = record.getMessage()
    except Exception:  # noqa: BLE001 - a bad format string: leave it to the handler's error path
        return
    record.msg, record.args = redact(msg), ()  # formatted once, here (mode iterates args: never None)
    if record.exc_info and not record.exc_text:
        try:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        except Exception:  # noqa: BLE001
            pass
    if record.exc_text:  # (a handler before this filter may have formatted it already)
        record.exc_text = redact(record.exc_text)
    if record.stack_info:
        record.stack_info = redact(record.stack_info)


class RedactingFilter(logging.Filter):
    """Masks recipients in every record that passes (attach to a handler)."""

    def filter(self, record: logging.LogRecord) -> bool:
        _scrub(record)
        return True


_installed = False


def install() -> None:
    """Redact every log record of this process from now on (idempotent)."""
    global _installed
    if _installed:
        return
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        _scrub(record)
        return record

    logging.setLogRecordFactory(factory)
    _installed = True
