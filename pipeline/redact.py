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
number), e-mail addresses, ``apns:``/``fcm:`` addresses, runs of 64 hex digits
(APNs tokens), long base64url runs (FCM tokens), ``nfk_…`` API keys and
``Bearer`` credentials. :class:`RedactingFilter` does the same as a
``logging.Filter`` for handlers set up elsewhere.
"""

from __future__ import annotations

import logging
import re
from typing import Any

__all__ = ["mask_phone", "mask_email", "mask_token", "mask_address", "redact", "RedactingFilter", "install"]

_EMAIL_RE = re.compile(r"([A-Za-z0-9._%+\-]{1,64})@([A-Za-z0-9\-]+(?:\.[A-Za-z0-9\-]+)+)")
_PUSH_RE = re.compile(r"\b(apns|fcm):([A-Za-z0-9_\-:.]{8,})")
_API_KEY_RE = re.compile(r"\bnfk_([0-9a-f]{12})_[A-Za-z0-9_\-]+")
_BEARER_RE = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=\-]{6,}")
_HEX_TOKEN_RE = re.compile(r"(?<![0-9A-Za-z])[0-9a-fA-F]{64}(?![0-9A-Za-z])")
_LONG_TOKEN_RE = re.compile(r"(?<![A-Za-z0-9_\-:])[A-Za-z0-9_\-:]{100,}(?![A-Za-z0-9_\-:])")
_PLUS_PHONE_RE = re.compile(r"(?<![\w+])\+\d(?:[ ().\-]{0,2}\d){5,14}(?!\d)")
_BARE_PHONE_RE = re.compile(r"(?<![\w.+])\d{7,15}(?![\w.])")


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
        return redact(s.split("?", 1)[0])  # the query may carry a secret
    return redact(s)


def redact(text: str) -> str:
    """``text`` with every recipient-like value masked (see the module doc)."""
    if not text:
        return text
    text = _BEARER_RE.sub(lambda m: f"{m.group(1)} ***", text)
    text = _API_KEY_RE.sub(lambda m: f"nfk_{m.group(1)}_***", text)
    text = _PUSH_RE.sub(lambda m: f"{m.group(1)}:{mask_token(m.group(2))}", text)
    text = _EMAIL_RE.sub(lambda m: mask_email(m.group(0)), text)
    text = _HEX_TOKEN_RE.sub(lambda m: mask_token(m.group(0)), text)
    text = _LONG_TOKEN_RE.sub(lambda m: mask_token(m.group(0)), text)
    text = _PLUS_PHONE_RE.sub(lambda m: mask_phone(m.group(0)), text)
    text = _BARE_PHONE_RE.sub(lambda m: mask_phone(m.group(0)), text)
    return text


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
