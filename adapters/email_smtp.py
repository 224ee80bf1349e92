"""E-mail over SMTP submission (RFC 6409) with aiosmtplib.

Sessions are pooled per provider (:mod:`adapters._smtp_pool`): a session is
opened once with aiosmtplib (connect with implicit TLS with ``use_tls``, STARTTLS
with ``start_tls=True``, or opportunistic STARTTLS when ``None``; optional AUTH;
EHLO) and then carries many messages through :mod:`adapters._smtp_wire`: when the
server offers PIPELINING, ``[RSET] MAIL RCPT DATA`` as one group and the message
after the 354 (two writes), otherwise one command at a time. Every reply is read
in order, so we know how far the dialogue got when it breaks:

* connect / EHLO / AUTH / MAIL / RCPT fail or time out → nothing was submitted:
  TRANSIENT_ERROR (AUTH failure is ours, not the recipient's: ``auth: …``);
* 5xx at RCPT → PERMANENT_ERROR ``invalid_address``; 4xx → TRANSIENT_ERROR;
* a timeout, a dropped connection or a reply that is not SMTP once the message
  went out: the server may have queued it → TIMEOUT_UNKNOWN (before it went
  out, nothing can have been queued: TRANSIENT_ERROR);
* a 354 to a DATA whose RCPT was refused (possible when pipelined) is ended
  with an empty message, as RFC 2920 §3.1 asks;
* an address that is not ASCII cannot go in MAIL / RCPT without SMTPUTF8:
  PERMANENT_ERROR ``invalid_address``, nothing sent;
* 5xx answer to DATA → PERMANENT_ERROR ``rejected``; 4xx → TRANSIENT_ERROR.

The pool (``max_connections``, a provider's ``pool``; default 10) keeps at most
that many sessions per provider; a send takes an idle session, or opens one
when none is idle and fewer are open, or waits its turn (first come, first
served; at most ``timeout`` seconds, then TRANSIENT_ERROR ``pool: …``, nothing
sent). After the message the session goes back to the pool:

* a transaction that ended with a 4xx/5xx reply leaves the session usable:
  the next message on it starts with RSET;
* any other error (a timeout, a dropped connection, a reply we could not read)
  closes the session: it is never reused;
* a session idle for ``keepalive_s`` (30 s) or that has carried
  ``max_messages`` (100) is quit (QUIT, then close); :meth:`SmtpProvider.close`
  quits them all;
* a reused session that the server closed while it was idle fails at RSET or
  MAIL (a dropped connection or a 421 reply), before anything of the message
  was sent: the send tries once more on a fresh session, in the same slot.

The message is ``multipart/alternative`` (text + html; ``text/plain`` alone
without html), built here as bytes (:func:`build_mime`, not with
:class:`email.message.EmailMessage`, whose header parsing was most of the
adapter's CPU): headers RFC 5322 / 2047 (non-ASCII or unusual subjects and
display names as UTF-8 base64 encoded-words, lines folded at 78), bodies in
UTF-8 as 7bit when ASCII with lines ≤ 998 octets, else quoted-printable or
base64 (whichever is shorter, roughly), CRLF line ends; aiosmtplib dot-stuffs
DATA. ``Message-ID`` is derived from the delivery id
(``<delivery_id@msgid_domain>``) and ``X-Notify-Id`` carries it too, so a
resend after TIMEOUT_UNKNOWN carries the same Message-ID (mail stores and many
MTAs drop duplicates by it) and bounces (DSNs quote it) can be matched back to
the delivery. A line break in a header value (subject, display name, address,
unsubscribe link), a control character in the display name or a delivery id
that is not a dot-atom (it would make a Message-ID readers cut short) is
refused before any call: PERMANENT_ERROR ``invalid_request``.

The client greets with ``EHLO <local_hostname>``, by default the Message-ID
domain (never the machine's ``localhost``, which receiving MTAs may refuse as
a non-FQDN HELO). Mail of every category but the bulk ones
(``bulk_categories``: marketing) is transactional and carries
``Auto-Submitted: auto-generated`` (RFC 3834), so auto-responders (vacation
replies, out-of-office) do not answer it. A delivery whose content carries
its one-click unsubscribe link (``unsubscribe_url``, as for SendGrid and SES)
carries RFC 8058's ``List-Unsubscribe: <url>`` and ``List-Unsubscribe-Post:
List-Unsubscribe=One-Click`` (:func:`list_unsubscribe_lines`).

Reconciliation: SMTP has no status query. :meth:`SmtpProvider.query` answers
``found=False, status=NOT_FOUND, supported=False`` meaning "truly unknown":
the caller resends under the same Message-ID or sends the delivery to REVIEW.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import email.utils
import os
import re
import ssl
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Mapping, Optional

import aiosmtplib
from aiosmtplib.email import quote_address

from pipeline.models import AttemptResult, Delivery

from ._smtp_pool import PooledSession, SmtpPool
from ._smtp_wire import Reply, SmtpWire, reply_error
from .base import PermanentKind, Provider, SendResult, Stopwatch, email_bodies, unsubscribe_headers

__all__ = ["SmtpConfig", "SmtpProvider", "build_mime", "list_unsubscribe_lines", "message_id_for"]


@dataclass
class SmtpConfig:
    host: str = "127.0.0.1"
    port: int = 587
    from_addr: str = "notify@example.com"
    from_name: Optional[str] = None
    username: Optional[str] = None
    password: Optional[str] = None
    use_tls: bool = False  #: implicit TLS (port 465)
    start_tls: Optional[bool] = None  #: True: require STARTTLS; None: use it when offered
    validate_certs: bool = True
    cert_bundle: Optional[str] = None
    tls_context: Optional[ssl.SSLContext] = None
    timeout: float = 30.0
    msgid_domain: str = "notify.invalid"
    #: the EHLO name; None: ``msgid_domain``
    local_hostname: Optional[str] = None
    #: categories sent without ``Auto-Submitted: auto-generated`` (bulk, not transactional)
    bulk_categories: tuple[str, ...] = ("marketing",)
    #: sessions (connections) kept per provider (``pool`` in a provider's table, as
    #: for the HTTP adapters: adapters/registry.py maps it)
    max_connections: int = 10
    #: a session idle this long is quit (servers drop idle clients after 60-300 s)
    keepalive_s: float = 30.0
    #: a session is quit after this many messages (relays cap messages per connection)
    max_messages: int = 100
    name: str = "smtp"

    @property
    def ehlo_name(self) -> str:
        return self.local_hostname or self.msgid_domain


def message_id_for(delivery_id: str, domain: str) -> str:
    return f"<{delivery_id}@{domain}>"


# ---------------------------------------------------------------- MIME

#: what ``str.splitlines`` breaks on: none of it may be in a header value (header injection)
_LINE_BREAK_RE = re.compile("[\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")
#: control characters but the tab (C0, DEL, C1)
_CONTROL_RE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f]")
#: a header value that goes out as it is: printable ASCII words, one space between them
_PLAIN_RE = re.compile(r"[!-~]+(?: [!-~]+)*")
_ATEXT = r"[A-Za-z0-9!#$%&'*+\-/=?^_`{|}~]+"
#: a display name that goes in a quoted-string: printable ASCII, spaces and tabs (kept as
#: they are by readers, where the text of an encoded-word in a phrase has its runs of
#: whitespace collapsed by CPython's parser)
_QUOTABLE_RE = re.compile(r"[\t -~]+")
#: a display name of atoms only (no quotes needed)
_ATOMS_RE = re.compile(f"{_ATEXT}(?: {_ATEXT})*")
#: a local part that needs no quotes
_DOT_ATOM_RE = re.compile(f"{_ATEXT}(?:\\.{_ATEXT})*")
#: the id left of the @ in a Message-ID: a dot-atom (RFC 5322 ``id-left``), as the
#: delivery ids made by pipeline/ids.py are (``n_<hex>.<channel>[.<hex>]``)
_ID_RE = _DOT_ATOM_RE
#: an address that aiosmtplib's ``quote_address`` leaves as it is (a dot-atom local part,
#: a host name): MAIL / RCPT go out without its per-command ``parseaddr``
_SIMPLE_ADDR_RE = re.compile(f"{_ATEXT}(?:\\.{_ATEXT})*@[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?")
#: a List-Unsubscribe URL that goes in the header as it is: printable ASCII, no space, no ``<`` / ``>``
_URL_RE = re.compile(r"[!-;=?-~]+")
#: a line longer than SMTP's 998 octets (the body must then be encoded)
_LONG_LINE_RE = re.compile(rb"[^\n]{999}")
#: header lines are folded at 78 characters (RFC 5322 §2.1.1)
_WIDTH = 78
#: UTF-8 octets per encoded-word: 56 base64 characters, 68 with ``=?utf-8?b?…?=``
_WORD_OCTETS = 42
#: in a display name, as many as one encoded-word holds (72 characters, RFC 2047's
#: limit is 75): CPython's parser keeps the space between two encoded-words of a
#: phrase (RFC 2047 §6.2 drops it), so a name that fits one word reads the same everywhere
_NAME_OCTETS = 45


def _check_header(what: str, value: str) -> None:
    if _LINE_BREAK_RE.search(value):
        raise ValueError(f"{what}: header values may not contain line breaks")


def _encoded_words(value: str, octets: int = _WORD_OCTETS) -> list[str]:
    """``value`` as RFC 2047 ``B`` encoded-words in UTF-8, each of at most
    ``octets`` octets (68 characters with 42) and each a whole number of
    characters (never a split UTF-8 sequence), to be joined by folding
    whitespace (which decoders drop between encoded-words)."""
    data = value.encode("utf-8")
    words = []
    i, n = 0, len(data)
    while i < n:
        j = min(i + octets, n)
        while j < n and (data[j] & 0xC0) == 0x80:  # a continuation octet: end before its character
            j -= 1
        words.append("=?utf-8?b?" + binascii.b2a_base64(data[i:j], newline=False).decode("ascii") + "?=")
        i = j
    return words


def _fold(prefix: str, value: str) -> Optional[str]:
    """``prefix + value`` folded before spaces into lines of at most 78; None when
    a word is too long for a line (the caller encodes instead)."""
    if len(prefix) + len(value) <= _WIDTH:
        return prefix + value + "\r\n"
    out = [prefix]
    width = len(prefix)
    for k, word in enumerate(value.split(" ")):
        if k == 0:
            out.append(word)
            width += len(word)
        elif width + 1 + len(word) <= _WIDTH:
            out.append(" " + word)
            width += 1 + len(word)
        else:
            out.append("\r\n " + word)  # unfolding removes the CRLF, the space stays
            width = 1 + len(word)
        if width > _WIDTH:
            return None
    out.append("\r\n")
    return "".join(out)


def unstructured_header(name: str, value: str) -> str:
    """``Name: value`` CRLF for an unstructured header (Subject, X-…): as it is when
    it is printable ASCII with single spaces (folded), else encoded-words, so
    that a reader decodes exactly ``value`` (leading, trailing or repeated
    whitespace, control characters and text that looks like an encoded-word
    included)."""
    _check_header(name, value)
    if not value:
        return name + ":\r\n"
    if "=?" not in value and _PLAIN_RE.fullmatch(value):
        folded = _fold(name + ": ", value)
        if folded is not None:
            return folded
    return name + ": " + "\r\n ".join(_encoded_words(value)) + "\r\n"


def from_header(addr: str, display_name: Optional[str]) -> str:
    """``From:`` with the optional display name: atoms as they are, other
    printable ASCII quoted, anything else as encoded-words. Built once per
    provider."""
    _check_header("from_addr", addr)
    if not addr.isascii():
        raise ValueError("from_addr: not ASCII (SMTPUTF8 is not supported)")
    if not display_name:
        return f"From: {addr}\r\n"
    _check_header("from_name", display_name)
    if _CONTROL_RE.search(display_name):  # readers flag them in a phrase, even encoded
        raise ValueError("from_name: control characters")
    mailbox = f"<{addr}>"
    if "=?" not in display_name and _QUOTABLE_RE.fullmatch(display_name):
        if _ATOMS_RE.fullmatch(display_name):
            phrase = display_name
        else:
            phrase = '"' + display_name.replace("\\", "\\\\").replace('"', '\\"') + '"'
        line = f"From: {phrase} {mailbox}"
        if len(line) <= _WIDTH:
            return line + "\r\n"
        if 6 + len(phrase) <= _WIDTH:
            return f"From: {phrase}\r\n {mailbox}\r\n"
    words = _encoded_words(display_name, _NAME_OCTETS)
    last = len(words[-1]) + (6 if len(words) == 1 else 1)
    sep = " " if last + 1 + len(mailbox) <= _WIDTH else "\r\n "
    return "From: " + "\r\n ".join(words) + sep + mailbox + "\r\n"


def to_header(address: str) -> str:
    """``To:`` with the recipient's address; a local part that is not a dot-atom is
    quoted (``"a,b"@example.org``)."""
    _check_header("address", address)
    local, _, domain = address.rpartition("@")
    if local and address.isascii() and not _DOT_ATOM_RE.fullmatch(local) \
            and not (len(local) > 1 and local[0] == local[-1] == '"'):
        local = '"' + local.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return f"To: {local}@{domain}\r\n"


def list_unsubscribe_lines(content: Mapping[str, Any]) -> str:
    """RFC 8058's ``List-Unsubscribe: <url>`` and ``List-Unsubscribe-Post:
    List-Unsubscribe=One-Click`` (CRLF after each) when the content carries its
    one-click link (``unsubscribe_url``, as for SendGrid and SES:
    :func:`adapters.base.unsubscribe_headers`), else "". A line break in the link
    is refused (ValueError), as in every header. A link no header can carry
    leaves both out: what SendGrid and SES leave out (not http(s), a space, ``<``
    or ``>``) and, here, a control character or non-ASCII (the message has no
    SMTPUTF8) or a line over SMTP's 998 octets. The URL is never folded (RFC
    2369: no whitespace inside the angle brackets), so its line may pass 78."""
    url = content.get("unsubscribe_url")
    if not url:
        return ""
    if isinstance(url, str):
        _check_header("unsubscribe_url", url)
    headers = unsubscribe_headers(content)
    if not headers:
        return ""
    value = headers["List-Unsubscribe"]  # "<url>"
    if not _URL_RE.fullmatch(value, 1, len(value) - 1) or len(value) > 998 - len("List-Unsubscribe: "):
        return ""
    return f"List-Unsubscribe: {value}\r\nList-Unsubscribe-Post: {headers['List-Unsubscribe-Post']}\r\n"


def _body(text: str) -> tuple[bytes, bytes]:
    """``(Content-Transfer-Encoding, body)``: the text in UTF-8 with CRLF line ends
    (CRLF, CR and LF all become CRLF, and it ends with one, as the standard
    library's ``set_content`` does): 7bit when it is ASCII without NUL and no
    line is longer than 998 octets, else quoted-printable (lines of at most 76),
    or base64 when about a sixth or more of its octets are non-ASCII (CJK,
    Cyrillic: base64 is the shorter then)."""
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    if not text.endswith("\n"):
        text += "\n"
    data = text.encode("utf-8")
    extra = len(data) - len(text)  # octets beyond one per character: 0 for ASCII
    if extra == 0 and "\x00" not in text and not _LONG_LINE_RE.search(data):
        return b"7bit", data.replace(b"\n", b"\r\n")
    if extra * 12 < len(data):
        return b"quoted-printable", binascii.b2a_qp(data, istext=True).replace(b"\n", b"\r\n")
    return b"base64", base64.encodebytes(data).replace(b"\n", b"\r\n")


_TEXT_PART = b'Content-Type: text/plain; charset="utf-8"\r\nContent-Transfer-Encoding: '
_HTML_PART = b'Content-Type: text/html; charset="utf-8"\r\nContent-Transfer-Encoding: '


def build_mime(head: str, text: str, html: Optional[str]) -> bytes:
    """The message: ``head`` (header lines, each ending in CRLF), MIME-Version,
    and ``text`` alone (``text/plain``) or ``text`` and ``html`` as
    ``multipart/alternative``."""
    cte, body = _body(text)
    if not html:
        return b"".join((head.encode("utf-8"), b"MIME-Version: 1.0\r\n", _TEXT_PART, cte, b"\r\n\r\n", body))
    hcte, hbody = _body(html)
    while True:  # a random boundary; a 7bit body could hold it (encoded ones cannot)
        boundary = b"=_" + os.urandom(12).hex().encode("ascii")
        if boundary not in body and boundary not in hbody:
            break
    delim = b"\r\n--" + boundary + b"\r\n"  # the CRLF before "--" belongs to the delimiter
    return b"".join((
        head.encode("utf-8"),
        b'MIME-Version: 1.0\r\nContent-Type: multipart/alternative;\r\n boundary="', boundary, b'"\r\n',
        delim, _TEXT_PART, cte, b"\r\n\r\n", body,
        delim, _HTML_PART, hcte, b"\r\n\r\n", hbody,
        b"\r\n--", boundary, b"--\r\n",
    ))


# ---------------------------------------------------------------- the provider


def envelope_address(address: str) -> bytes:
    """An address as MAIL / RCPT carry it (``<addr>``), as aiosmtplib's
    ``quote_address`` writes it; a plain one without its ``parseaddr``
    (``_SIMPLE_ADDR_RE``). UnicodeEncodeError: not ASCII (no SMTPUTF8 here)."""
    if _SIMPLE_ADDR_RE.fullmatch(address):
        return b"<" + address.encode("ascii") + b">"
    return quote_address(address).encode("ascii")


class _Dialogue:
    """How far one message's dialogue got (``stage``: pool, connect, auth, rset,
    mail, rcpt, data) and whether the message itself went out (``sent``: only
    then may the server have queued it)."""

    __slots__ = ("stage", "sent")

    def __init__(self) -> None:
        self.stage = "pool"
        self.sent = False

    async def envelope(self, wire: SmtpWire, timeout: float, rset: bool, sender: bytes, recipient: bytes) -> None:
        """``[RSET] MAIL RCPT DATA`` up to the 354: one group when the server
        pipelines (every reply of the group is read, so the session stays in
        step), else one command at a time. A refusal is raised as
        aiosmtplib.SMTPResponseException at its stage."""
        steps = [("mail", b"MAIL FROM:" + sender, (250,)), ("rcpt", b"RCPT TO:" + recipient, (250, 251)),
                 ("data", b"DATA", (354,))]
        if rset:
            steps.insert(0, ("rset", b"RSET", (250,)))
        pipelined = wire.pipelining
        if pipelined:
            wire.write(*(command for _, command, _ in steps))
        refused: Optional[tuple[str, Reply]] = None
        reply = None
        for stage, command, ok in steps:
            if refused is None:
                self.stage = stage
            if not pipelined:
                wire.write(command)
            reply = await wire.reply(timeout)
            if reply.code == 421:  # the server is closing the session: nothing more is read from it
                wire.close()
                refused = refused or (stage, reply)
                break
            if reply.code not in ok and refused is None:
                refused = (stage, reply)
                if not pipelined:
                    break
        if refused is None:
            return
        if pipelined and reply is not None and reply.code == 354:
            # a DATA taken after a refused RCPT: an empty message ends it, which the
            # server must not send to anybody (RFC 2920 §3.1)
            wire.write_message(b"")
            await wire.reply(timeout)
        self.stage = refused[0]
        raise reply_error(refused[1])

    async def message(self, wire: SmtpWire, timeout: float, raw: bytes) -> None:
        """The message after the 354, and the server's answer to it."""
        self.stage = "data"
        wire.write_message(raw)
        self.sent = True
        reply = await wire.reply(timeout)
        if reply.code != 250:
            if reply.code == 421:
                wire.close()
            raise reply_error(reply)


def _stale(session: Optional[PooledSession], stage: str, exc: BaseException) -> bool:
    """A reused session that the server closed while it was idle: it fails at RSET
    or MAIL with a dropped connection or a 421 reply, before anything of this
    message was sent, so a fresh session may take it."""
    if session is None or not session.reused or stage not in ("rset", "mail"):
        return False
    if isinstance(exc, (aiosmtplib.SMTPServerDisconnected, ConnectionError)):
        return True
    return isinstance(exc, aiosmtplib.SMTPResponseException) and (exc.code == 421 or stage == "rset")


class SmtpProvider(Provider):
    channel = "email"

    def __init__(self, config: SmtpConfig, *, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.name = config.name
        self._clock = clock
        self._pool: Optional[SmtpPool] = None
        self._from: Optional[str] = None  #: the From line, built once
        self._date: tuple[int, str] = (-1, "")  #: (second, its Date line)
        self._sender_b: Optional[bytes] = None  #: MAIL FROM's address, quoted once

    # ------------------------------------------------------------ the message

    def build_message(self, delivery: Delivery) -> bytes:
        """The message as sent (CRLF line ends, before dot-stuffing). ValueError or
        TypeError: it cannot be sent (a line break in a header, …)."""
        c = delivery.content or {}
        cfg = self.config
        if self._from is None:
            self._from = from_header(cfg.from_addr, cfg.from_name)
        did = delivery.delivery_id
        if not _ID_RE.fullmatch(did):
            raise ValueError(f"delivery_id {did!r}: not usable in a Message-ID")
        now = int(self._clock())
        if now != self._date[0]:
            # "+0000", as the standard library renders it ("GMT" is an obsolete zone, RFC 5322 §4.3)
            when = email.utils.format_datetime(datetime.fromtimestamp(now, timezone.utc))
            self._date = (now, f"Date: {when}\r\n")
        head = [
            self._from,
            to_header(delivery.address),
            unstructured_header("Subject", str(c.get("subject") or "")),
            self._date[1],
            f"Message-ID: {message_id_for(did, cfg.msgid_domain)}\r\nX-Notify-Id: {did}\r\n",
        ]
        if delivery.category:
            head.append(unstructured_header("X-Notify-Category", delivery.category))
        if delivery.category not in cfg.bulk_categories:
            head.append("Auto-Submitted: auto-generated\r\n")
        if c.get("unsubscribe_url"):
            head.append(list_unsubscribe_lines(c))
        text, html = email_bodies(c)
        return build_mime("".join(head), str(text or ""), str(html) if html else None)

    # ------------------------------------------------------------ sessions

    def _client(self) -> aiosmtplib.SMTP:
        cfg = self.config
        return aiosmtplib.SMTP(
            hostname=cfg.host,
            port=cfg.port,
            timeout=cfg.timeout,
            use_tls=cfg.use_tls,
            start_tls=cfg.start_tls,
            validate_certs=cfg.validate_certs,
            cert_bundle=cfg.cert_bundle,
            tls_context=cfg.tls_context,
            local_hostname=cfg.ehlo_name,
        )

    def _pool_here(self) -> SmtpPool:
        """The pool of the running loop (made on the first send; sessions are bound
        to the loop they were opened on, so a provider used from another loop
        starts a pool of its own there)."""
        pool = self._pool
        if pool is None or pool.loop is not asyncio.get_running_loop():
            cfg = self.config
            pool = self._pool = SmtpPool(size=cfg.max_connections, idle_s=cfg.keepalive_s,
                                         max_messages=cfg.max_messages, quit_timeout=min(5.0, cfg.timeout))
        return pool

    @property
    def pool(self) -> Optional[SmtpPool]:
        """The session pool (None before the first send): counters for tests and stats."""
        return self._pool

    async def close(self) -> None:
        """Quit the pooled sessions."""
        pool, self._pool = self._pool, None
        if pool is not None and pool.loop is asyncio.get_running_loop():
            await pool.close()

    async def _open(self, session: PooledSession, d: _Dialogue) -> None:
        """Connect (TLS as configured), AUTH, EHLO with aiosmtplib; then the
        session's dialogue is ours (:class:`SmtpWire`)."""
        smtp: aiosmtplib.SMTP = session.smtp  # type: ignore[assignment]
        d.stage = "connect"
        await smtp.connect()
        if self.config.username:
            d.stage = "auth"
            await smtp.login(self.config.username, self.config.password or "")
        d.stage = "connect"
        if smtp.is_ehlo_or_helo_needed:
            try:
                await smtp.ehlo()
            except aiosmtplib.SMTPHeloError:
                await smtp.helo()  # an old server: no extensions, one command at a time
        session.smtp = SmtpWire.take_over(smtp)

    def _sender(self) -> bytes:
        sender = self._sender_b
        if sender is None:
            sender = self._sender_b = envelope_address(self.config.from_addr)
        return sender

    # ------------------------------------------------------------ sending

    async def send(self, delivery: Delivery) -> SendResult:
        sw = Stopwatch()
        name = self.name
        cfg = self.config
        if "@" not in delivery.address:
            return SendResult(
                AttemptResult.PERMANENT_ERROR, name, error="no e-mail address", permanent_kind=PermanentKind.INVALID_ADDRESS
            )
        try:
            raw = self.build_message(delivery)
        except (ValueError, TypeError) as exc:  # e.g. a line break in a header: no injection, no call
            return SendResult(AttemptResult.PERMANENT_ERROR, name, error=f"bad message: {exc}"[:300],
                              permanent_kind=PermanentKind.INVALID_REQUEST, latency_ms=sw.ms)
        try:
            recipient = envelope_address(delivery.address)
        except (UnicodeEncodeError, ValueError) as exc:  # not ASCII: no SMTPUTF8 here, no retry helps
            return SendResult(AttemptResult.PERMANENT_ERROR, name, error=f"address: {exc}"[:300],
                              permanent_kind=PermanentKind.INVALID_ADDRESS, latency_ms=sw.ms)
        msg_id = message_id_for(delivery.delivery_id, cfg.msgid_domain)
        pool = self._pool_here()
        session: Optional[PooledSession] = None
        held = False  # we hold a slot of the pool: give it back
        reusable = False  # the session ended in a known state: keep it
        d = _Dialogue()
        try:
            session = await pool.take(cfg.timeout)
            held = True
            while True:
                try:
                    if session is None:
                        session = pool.opened_session(self._client())
                        await self._open(session, d)
                    elif (early := session.smtp.unsolicited()) is not None:
                        # said while idle (a 421 before closing): not the answer to anything of
                        # ours, and the session is left before anything of this message was sent
                        d.stage = "rset"
                        session.smtp.close()
                        raise reply_error(early)
                    await d.envelope(session.smtp, cfg.timeout, session.needs_rset, self._sender(), recipient)
                    session.needs_rset = False
                    break
                except (aiosmtplib.SMTPServerDisconnected, aiosmtplib.SMTPResponseException, ConnectionError) as exc:
                    if not _stale(session, d.stage, exc):
                        raise
                    pool.drop(session)  # the slot stays ours: one more try on a fresh session
                    session = None
            await d.message(session.smtp, cfg.timeout, raw)
            d.stage = "done"
            session.messages += 1
            reusable = True
        except aiosmtplib.SMTPAuthenticationError as exc:
            return SendResult(AttemptResult.TRANSIENT_ERROR, name, error=f"auth: {exc.code} {exc.message}"[:300], latency_ms=sw.ms)
        except aiosmtplib.SMTPResponseException as exc:
            stage = d.stage
            err = f"{stage}: {exc.code} {exc.message}"[:300]
            if stage in ("rset", "mail", "rcpt", "data") and 400 <= exc.code < 600 and session.smtp.is_connected:  # type: ignore[union-attr]
                # a clean refusal in a session that has greeted: it is fine, its
                # transaction is reset before the next message
                session.needs_rset = True  # type: ignore[union-attr]
                reusable = True
            if 500 <= exc.code < 600 and stage == "rcpt":
                return SendResult(
                    AttemptResult.PERMANENT_ERROR, name, error=err, permanent_kind=PermanentKind.INVALID_ADDRESS, latency_ms=sw.ms
                )
            if 500 <= exc.code < 600 and stage == "data":
                return SendResult(
                    AttemptResult.PERMANENT_ERROR, name, error=err, permanent_kind=PermanentKind.REJECTED, latency_ms=sw.ms
                )
            # 4xx anywhere, 5xx at connect/EHLO/MAIL (our side: sender, policy, TLS)
            return SendResult(AttemptResult.TRANSIENT_ERROR, name, error=err, latency_ms=sw.ms)
        except (aiosmtplib.SMTPTimeoutError, aiosmtplib.SMTPServerDisconnected, ConnectionError, TimeoutError) as exc:
            kind = type(exc).__name__
            if d.sent:  # the message went out: the server may have queued it
                return SendResult(
                    AttemptResult.TIMEOUT_UNKNOWN,
                    name,
                    provider_msg_id=msg_id,
                    error=f"data: {kind}: {exc}"[:300],
                    latency_ms=sw.ms,
                )
            return SendResult(AttemptResult.TRANSIENT_ERROR, name, error=f"{d.stage}: {kind}: {exc}"[:300], latency_ms=sw.ms)
        except Exception as exc:  # noqa: BLE001 - OSError, TLS errors, SMTPNotSupported, a reply that is not SMTP, the pool closed, …
            result = AttemptResult.TIMEOUT_UNKNOWN if d.sent else AttemptResult.TRANSIENT_ERROR
            return SendResult(result, name, provider_msg_id=msg_id if d.sent else None,
                              error=f"{d.stage}: {type(exc).__name__}: {exc}"[:300], latency_ms=sw.ms)
        finally:
            if held:
                # a broken dialogue (or a cancelled send) closes the session without QUIT,
                # which could wait out another timeout
                pool.give_back(session, reusable=reusable)
        return SendResult(AttemptResult.ACCEPTED, name, provider_msg_id=msg_id, latency_ms=sw.ms)
