"""Tracking (issue 20 item 4): signed link tokens, the rewrite of rendered
content's links to the API's redirect, the open pixel, the one-click
unsubscribe link (RFC 8058), and the opt-outs a preferences update makes.
Pure: no I/O; the key is given.

Tokens
------
A click token names (delivery id, link index, target URL); an open token names
a delivery id. Both are ``base64url(mac ‖ payload)`` without padding, where
``mac`` is the first 16 bytes of HMAC-SHA256(key, kind ‖ payload) and
``payload`` is the delivery id (compacted: ``n_<20 hex>.<channel>`` → 11
bytes), then for a click the index (one byte, links 0–254) and the URL's
bytes. The token is the only authority of ``GET /t/c/<token>``: it cannot
be forged nor altered without the key, so the redirect is never open.

An unsubscribe token (``<base_url>/u/<token>``, :func:`unsubscribe_url`)
names a switch of one user: ``payload`` = the channel's number (one byte),
then the user id, the category and the producer, each as a 2-byte big-endian
length and its UTF-8 bytes; ``mac`` over ``"u"`` ‖ payload. It is the only
authority of ``POST /u/<token>`` (RFC 8058 one-click: no key, no cookie), so
it names nothing but that one switch.

Rewriting
---------
``http``/``https`` links in email (``text``, ``html``), push (``body``) and
inbox (``body``) become ``<base_url>/t/c/<token>``; the same URL in two parts
gets the same index; a link already pointing at ``<base_url>/t/`` is left
alone (never rewritten twice), and so is the unsubscribe link
(``<base_url>/u/``: it must reach the API itself). A part with a length limit (push and inbox
bodies) whose rewritten text would exceed it keeps its original links: a
truncated link would break, an untracked one still works.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import html
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

__all__ = ["Tracker", "Link", "Unsubscribe", "sign_click", "sign_open", "verify_click", "verify_open", "rewrite",
           "sign_unsubscribe", "verify_unsubscribe", "unsubscribe_url", "list_unsubscribe_headers",
           "UNSUBSCRIBE_CHANNELS", "ONE_CLICK_BODY", "switched_off", "TRACKED_PARTS", "MAX_LINKS"]

#: the parts whose links are rewritten, per channel
TRACKED_PARTS: dict[str, tuple[str, ...]] = {"email": ("text", "html"), "push": ("body",), "inbox": ("body",)}
#: links per delivery that get an index (the rest are left as they are)
MAX_LINKS = 255
#: the channels whose templates get ``unsubscribe_url`` (email also carries it in
#: its content, for the ``List-Unsubscribe`` header: :func:`list_unsubscribe_headers`)
UNSUBSCRIBE_CHANNELS = ("email", "push", "inbox")
#: RFC 8058: the body of the one-click POST (form-encoded)
ONE_CLICK_BODY = "List-Unsubscribe=One-Click"
_MAC = 16
_CHANNELS = ("inbox", "push", "sms", "email", "webhook")
_DID_RE = re.compile(r"^n_([0-9a-f]{20})\.(inbox|push|sms|email|webhook)$")
# a URL up to whitespace or a character that cannot end one in text or an attribute
_URL_RE = re.compile(r"""https?://[^\s<>"'`]+""", re.IGNORECASE)
_TRAIL = ".,;:!?)]}"


@dataclass(frozen=True)
class Tracker:
    """What the rewrite needs: the signing key (never in the settings), the
    API's public base URL, whether email gets an open pixel, and the parts'
    length limits (``Settings.channel_limits()``)."""

    key: bytes = field(repr=False)
    base_url: str
    open_pixel: bool = False
    limits: Mapping[str, Mapping[str, int]] = field(default_factory=dict)

    @property
    def prefix(self) -> str:
        return self.base_url.rstrip("/") + "/t/"

    @property
    def unsubscribe_prefix(self) -> str:
        return self.base_url.rstrip("/") + "/u/"


@dataclass(frozen=True)
class Link:
    delivery_id: str
    index: int
    url: str


@dataclass(frozen=True)
class Unsubscribe:
    """What an unsubscribe token names: one user's ``<category>.<channel>`` switch,
    and the producer whose delivery carried the link (``""``: the operator's)."""

    user_id: str
    category: str
    channel: str
    producer: str = ""


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> Optional[bytes]:
    if not isinstance(text, str) or not text or len(text) > 8192:
        return None
    try:
        return base64.urlsafe_b64decode(text.encode("ascii") + b"=" * (-len(text) % 4))
    except (binascii.Error, ValueError, UnicodeEncodeError):
        return None


def _pack_did(did: str) -> bytes:
    m = _DID_RE.match(did)
    if m:  # 0x01, 10 bytes of digest, the channel's number
        return b"\x01" + bytes.fromhex(m.group(1)) + bytes([_CHANNELS.index(m.group(2))])
    raw = did.encode("utf-8")
    if len(raw) > 250:
        raise ValueError("delivery id too long to sign")
    return b"\x00" + bytes([len(raw)]) + raw


def _unpack_did(buf: bytes) -> Optional[tuple[str, bytes]]:
    if buf[:1] == b"\x01" and len(buf) >= 12 and buf[11] < len(_CHANNELS):
        return f"n_{buf[1:11].hex()}.{_CHANNELS[buf[11]]}", buf[12:]
    if buf[:1] == b"\x00" and len(buf) >= 2 and len(buf) >= 2 + buf[1]:
        try:
            return buf[2: 2 + buf[1]].decode("utf-8"), buf[2 + buf[1]:]
        except UnicodeDecodeError:
            return None
    return None


def _mac(key: bytes, kind: bytes, payload: bytes) -> bytes:
    return hmac.new(key, kind + payload, hashlib.sha256).digest()[:_MAC]


def sign_click(key: bytes, delivery_id: str, index: int, url: str) -> str:
    if not 0 <= index < MAX_LINKS:
        raise ValueError("link index out of range")
    payload = _pack_did(delivery_id) + bytes([index]) + url.encode("utf-8")
    return _b64(_mac(key, b"c", payload) + payload)


def sign_open(key: bytes, delivery_id: str) -> str:
    payload = _pack_did(delivery_id)
    return _b64(_mac(key, b"o", payload) + payload)


def _checked(key: bytes, kind: bytes, token: str) -> Optional[bytes]:
    raw = _unb64(token)
    if raw is None or len(raw) <= _MAC:
        return None
    mac, payload = raw[:_MAC], raw[_MAC:]
    if not hmac.compare_digest(mac, _mac(key, kind, payload)):
        return None
    # base64 has several spellings of the same bytes (the last character's unused
    # bits): only the canonical one is the token
    return payload if _b64(raw) == token else None


def verify_click(key: bytes, token: str) -> Optional[Link]:
    """The link a click token names, or None (bad token, wrong key, any change)."""
    payload = _checked(key, b"c", token)
    if payload is None:
        return None
    got = _unpack_did(payload)
    if got is None or not got[1]:
        return None
    did, rest = got
    try:
        url = rest[1:].decode("utf-8")
    except UnicodeDecodeError:
        return None
    if not url.lower().startswith(("http://", "https://")):
        return None  # only http(s) targets are ever signed
    return Link(did, rest[0], url)


def verify_open(key: bytes, token: str) -> Optional[str]:
    """The delivery id an open token names, or None."""
    payload = _checked(key, b"o", token)
    if payload is None:
        return None
    got = _unpack_did(payload)
    return got[0] if got is not None and not got[1] else None


def _pack_str(text: str) -> bytes:
    raw = text.encode("utf-8")
    if len(raw) > 0xFFFF:
        raise ValueError("too long to sign")
    return len(raw).to_bytes(2, "big") + raw


def _unpack_strs(buf: bytes, n: int) -> Optional[list[str]]:
    out, at = [], 0
    for _ in range(n):
        if len(buf) < at + 2:
            return None
        size = int.from_bytes(buf[at:at + 2], "big")
        at += 2
        if len(buf) < at + size:
            return None
        try:
            out.append(buf[at:at + size].decode("utf-8"))
        except UnicodeDecodeError:
            return None
        at += size
    return out if at == len(buf) else None


def sign_unsubscribe(key: bytes, user_id: str, category: str, channel: str, producer: str = "") -> str:
    """The token of one user's ``<category>.<channel>`` switch (see the module's doc)."""
    if channel not in _CHANNELS or not user_id or not category:
        raise ValueError("an unsubscribe token names a user, a category and a channel")
    payload = bytes([_CHANNELS.index(channel)]) + _pack_str(user_id) + _pack_str(category) + _pack_str(producer)
    return _b64(_mac(key, b"u", payload) + payload)


def verify_unsubscribe(key: bytes, token: str) -> Optional[Unsubscribe]:
    """The switch an unsubscribe token names, or None (bad token, wrong key, any change)."""
    payload = _checked(key, b"u", token)
    if payload is None or payload[0] >= len(_CHANNELS):
        return None
    got = _unpack_strs(payload[1:], 3)
    if got is None or not got[0] or not got[1]:
        return None
    return Unsubscribe(got[0], got[1], _CHANNELS[payload[0]], got[2])


def unsubscribe_url(tracker: Tracker, user_id: str, category: str, channel: str, producer: str = "") -> str:
    """``<base_url>/u/<token>``: the one-click unsubscribe link of that switch."""
    return tracker.unsubscribe_prefix + sign_unsubscribe(tracker.key, user_id, category, channel, producer)


def list_unsubscribe_headers(url: str) -> dict[str, str]:
    """The e-mail headers of RFC 8058 one-click unsubscribe for ``url`` (an
    ``https`` URL in production: RFC 8058 asks for one; mail clients ignore
    ``http``): ``List-Unsubscribe: <url>`` and ``List-Unsubscribe-Post:
    List-Unsubscribe=One-Click``. The URL cannot break out of the header: a
    token is base64url and the base URL was checked (config/settings.py)."""
    if not isinstance(url, str) or not url.lower().startswith(("http://", "https://")) \
            or any(c in url for c in "<>\r\n\t "):
        raise ValueError("not an http(s) URL fit for List-Unsubscribe")
    return {"List-Unsubscribe": f"<{url}>", "List-Unsubscribe-Post": ONE_CLICK_BODY}


def _split_url(raw: str) -> tuple[str, str]:
    """A matched URL without the punctuation that ends a sentence: (url, rest)."""
    end = len(raw)
    while end > 0 and raw[end - 1] in _TRAIL:
        # a ")" that closes a "(" inside the URL belongs to it (wiki links)
        if raw[end - 1] == ")" and raw[:end].count("(") >= raw[:end].count(")"):
            break
        end -= 1
    return raw[:end], raw[end:]


def rewrite(tracker: Tracker, channel: str, delivery_id: str,
            content: Mapping[str, Any]) -> tuple[dict[str, Any], list[Link]]:
    """``content`` with its links rewritten to the tracker's redirect (and an
    email's open pixel), and the links in index order. Content of a channel
    that is not tracked comes back unchanged."""
    out = dict(content)
    parts = TRACKED_PARTS.get(channel, ())
    indexes: dict[str, int] = {}
    prefix, unsub_prefix = tracker.prefix, tracker.unsubscribe_prefix
    for part in parts:
        text = content.get(part)
        if not isinstance(text, str) or "://" not in text:
            continue
        is_html = channel == "email" and part == "html"
        local = dict(indexes)

        def repl(m: re.Match) -> str:
            url, rest = _split_url(m.group(0))
            target = html.unescape(url) if is_html else url
            if not url or target.lower().startswith((prefix.lower(), unsub_prefix.lower())):
                return m.group(0)
            if target not in local:
                if len(local) >= MAX_LINKS:
                    return m.group(0)
                local[target] = len(local)
            return f"{prefix}c/{sign_click(tracker.key, delivery_id, local[target], target)}{rest}"

        new = _URL_RE.sub(repl, text)
        limit = tracker.limits.get(channel, {}).get(part)
        if limit is not None and len(new) > limit:
            continue  # keep this part's links as they are (see the module's doc)
        indexes = local
        out[part] = new
    if channel == "email" and tracker.open_pixel and isinstance(out.get("html"), str):
        pixel = (f'<img src="{prefix}o/{sign_open(tracker.key, delivery_id)}.gif" width="1" height="1" alt=""'
                 ' style="display:none">')
        body = out["html"]
        at = body.lower().rfind("</body>")
        out["html"] = body[:at] + pixel + body[at:] if at >= 0 else body + pixel
    links = [Link(delivery_id, i, url) for url, i in sorted(indexes.items(), key=lambda kv: kv[1])]
    return out, links


def switched_off(before: Optional[Mapping[str, Any]], after: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The ``(category, channel)`` switches (``*`` for a wildcard) an update turns
    off: listed off in ``after`` and not off in ``before`` (absent is on)."""
    before = before or {}
    off = []
    for key, value in after.items():
        if not isinstance(key, str) or bool(value):
            continue
        prev = before.get(key)
        if prev is None or bool(prev):
            cat, _, chan = key.partition(".")
            off.append((cat, chan or "*"))
    return sorted(off)
