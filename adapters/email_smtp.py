"""E-mail over SMTP submission (RFC 6409) with aiosmtplib.

One connection per message: connect (implicit TLS with ``use_tls``, STARTTLS
with ``start_tls=True``, or opportunistic STARTTLS when ``None``), optional
AUTH, then MAIL / RCPT / DATA step by step, so we know how far the dialogue got
when it breaks:

* connect / EHLO / AUTH / MAIL / RCPT fail or time out → nothing was submitted:
  TRANSIENT_ERROR (AUTH failure is ours, not the recipient's: ``auth: …``);
* 5xx at RCPT → PERMANENT_ERROR ``invalid_address``; 4xx → TRANSIENT_ERROR;
* a timeout or a dropped connection during DATA: the server may have queued
  the message → TIMEOUT_UNKNOWN;
* 5xx answer to DATA → PERMANENT_ERROR ``rejected``; 4xx → TRANSIENT_ERROR.

The message is ``multipart/alternative`` (text + html) built with
:class:`email.message.EmailMessage`. ``Message-ID`` is derived from the
delivery id (``<delivery_id@msgid_domain>``) and ``X-Notify-Id`` carries it
too, so a resend after TIMEOUT_UNKNOWN carries the same Message-ID (mail
stores and many MTAs drop duplicates by it) and bounces (DSNs quote it) can be
matched back to the delivery.

The client greets with ``EHLO <local_hostname>``, by default the Message-ID
domain (never the machine's ``localhost``, which receiving MTAs may refuse as
a non-FQDN HELO). Mail of every category but the bulk ones
(``bulk_categories``: marketing) is transactional and carries
``Auto-Submitted: auto-generated`` (RFC 3834), so auto-responders (vacation
replies, out-of-office) do not answer it.

Reconciliation: SMTP has no status query. :meth:`SmtpProvider.query` answers
``found=False, status=NOT_FOUND, supported=False`` meaning "truly unknown":
the caller resends under the same Message-ID or sends the delivery to REVIEW.
"""

from __future__ import annotations

import email.utils
import ssl
import time
from dataclasses import dataclass
from email.message import EmailMessage
from typing import Callable, Optional

import aiosmtplib

from pipeline.models import AttemptResult, Delivery

from .base import PermanentKind, Provider, SendResult, Stopwatch, email_bodies

__all__ = ["SmtpConfig", "SmtpProvider", "message_id_for"]


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
    name: str = "smtp"

    @property
    def ehlo_name(self) -> str:
        return self.local_hostname or self.msgid_domain


def message_id_for(delivery_id: str, domain: str) -> str:
    return f"<{delivery_id}@{domain}>"


class SmtpProvider(Provider):
    channel = "email"

    def __init__(self, config: SmtpConfig, *, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.name = config.name
        self._clock = clock

    def build_message(self, delivery: Delivery) -> EmailMessage:
        c = delivery.content or {}
        msg = EmailMessage()
        cfg = self.config
        msg["From"] = email.utils.formataddr((cfg.from_name, cfg.from_addr)) if cfg.from_name else cfg.from_addr
        msg["To"] = delivery.address
        msg["Subject"] = str(c.get("subject") or "")
        msg["Date"] = email.utils.formatdate(self._clock(), localtime=False, usegmt=True)
        msg["Message-ID"] = message_id_for(delivery.delivery_id, cfg.msgid_domain)
        msg["X-Notify-Id"] = delivery.delivery_id
        if delivery.category:
            msg["X-Notify-Category"] = delivery.category
        if delivery.category not in cfg.bulk_categories:
            msg["Auto-Submitted"] = "auto-generated"
        text, html = email_bodies(c)
        msg.set_content(str(text or ""))
        if html:
            msg.add_alternative(str(html), subtype="html")
        return msg

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

    async def send(self, delivery: Delivery) -> SendResult:
        sw = Stopwatch()
        name = self.name
        if "@" not in delivery.address:
            return SendResult(
                AttemptResult.PERMANENT_ERROR, name, error="no e-mail address", permanent_kind=PermanentKind.INVALID_ADDRESS
            )
        try:
            msg = self.build_message(delivery)
        except (ValueError, TypeError) as exc:  # e.g. a line break in a header: no injection, no call
            return SendResult(AttemptResult.PERMANENT_ERROR, name, error=f"bad message: {exc}"[:300],
                              permanent_kind=PermanentKind.INVALID_REQUEST, latency_ms=sw.ms)
        msg_id = msg["Message-ID"]
        smtp = self._client()
        stage = "connect"
        try:
            await smtp.connect()
            if self.config.username:
                stage = "auth"
                await smtp.login(self.config.username, self.config.password or "")
            stage = "mail"
            await smtp.mail(self.config.from_addr)
            stage = "rcpt"
            await smtp.rcpt(delivery.address)
            stage = "data"
            await smtp.data(msg.as_bytes())
            stage = "done"
        except aiosmtplib.SMTPAuthenticationError as exc:
            return SendResult(AttemptResult.TRANSIENT_ERROR, name, error=f"auth: {exc.code} {exc.message}"[:300], latency_ms=sw.ms)
        except aiosmtplib.SMTPResponseException as exc:
            err = f"{stage}: {exc.code} {exc.message}"[:300]
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
            if stage == "data":
                return SendResult(
                    AttemptResult.TIMEOUT_UNKNOWN,
                    name,
                    provider_msg_id=msg_id,
                    error=f"data: {kind}: {exc}"[:300],
                    latency_ms=sw.ms,
                )
            return SendResult(AttemptResult.TRANSIENT_ERROR, name, error=f"{stage}: {kind}: {exc}"[:300], latency_ms=sw.ms)
        except Exception as exc:  # noqa: BLE001 - OSError, TLS errors, SMTPNotSupported, …
            result = AttemptResult.TIMEOUT_UNKNOWN if stage == "data" else AttemptResult.TRANSIENT_ERROR
            return SendResult(result, name, error=f"{stage}: {type(exc).__name__}: {exc}"[:300], latency_ms=sw.ms)
        finally:
            if stage != "done":
                smtp.close()  # a broken dialogue: no QUIT, it could wait out another timeout
        latency_ms = sw.ms
        try:
            await smtp.quit(timeout=min(5.0, self.config.timeout))
        except Exception:  # noqa: BLE001 - the message is queued; QUIT is a courtesy
            smtp.close()
        return SendResult(AttemptResult.ACCEPTED, name, provider_msg_id=msg_id, latency_ms=latency_ms)
