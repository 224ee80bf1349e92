"""E-mail through Twilio SendGrid: the v3 Mail Send API.

Wire protocol: ``POST /v3/mail/send`` with ``Authorization: Bearer <API key>``
and a JSON body: one personalization per message (``to``: the delivery's
address), ``custom_args.notify_id`` (our delivery id, which SendGrid repeats in
every Event Webhook event of the message), ``from``, ``subject``, ``content``
(``text/plain`` first, then ``text/html``, as SendGrid requires), ``headers``
(``X-Notify-Id``; ``Auto-Submitted: auto-generated`` on transactional mail, as
the SMTP adapter sends it; ``List-Unsubscribe`` and ``List-Unsubscribe-Post``,
RFC 8058 one-click, when the delivery carries its ``unsubscribe_url``) and
``categories`` (the notification's category).

Answers:

* 202 Accepted, ``X-Message-Id: <id>``: ACCEPTED, ``provider_msg_id`` = that id
  (the Event Webhook's ``sg_message_id`` starts with it: ``<id>.filter…``);
* 400 ``{"errors": [{"message", "field", "help"}]}``: PERMANENT_ERROR,
  ``invalid_address`` when an error names a recipient's address field
  (``personalizations.0.to.0.email``), else ``invalid_request``; 413 (too large)
  ``invalid_request``;
* 401 / 403 (the API key is wrong, revoked or lacks ``mail.send``; the From
  address is not a verified Sender Identity): TRANSIENT_ERROR ``auth: …`` with
  ``fault="config"``: not the recipient's fault; it counts against the breaker,
  is reported through ``Dispatcher(on_fault=)`` and another e-mail provider may
  take the message;
* 429: RATE_LIMITED, ``retry_after`` from ``Retry-After`` or else
  ``X-RateLimit-Reset`` (the unix time the window resets);
* 5xx, 408: TRANSIENT_ERROR; transport errors as every HTTP adapter
  (``adapters/_http.py``: never sent → TRANSIENT_ERROR, maybe sent →
  TIMEOUT_UNKNOWN).

SendGrid has no idempotency key and no status query in the Mail Send API (the
Email Activity API is a paid add-on): :meth:`query` answers ``supported=False``
and a resend after TIMEOUT_UNKNOWN carries the same ``X-Notify-Id`` and
``notify_id``. Delivery receipts come through the signed Event Webhook
(:func:`adapters.receipts.verify_sendgrid_signature`, ``POST /v1/receipts/<name>``).

A send goes straight through the aiohttp session of the adapter's client
(:class:`adapters._http.Route`), the same request as through ``httpx.AsyncClient``;
a client given to the constructor is used as it is.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional

import httpx
import orjson

from pipeline.models import AttemptResult, Delivery

from ._http import Reply, Route, direct_client, response_json, timed_send
from .base import Fault, PermanentKind, Provider, SendResult, email_bodies, parse_retry_after, unsubscribe_headers

__all__ = ["SendGridConfig", "SendGridProvider", "sendgrid_errors"]


@dataclass
class SendGridConfig:
    api_key: str
    from_addr: str
    from_name: Optional[str] = None
    reply_to: Optional[str] = None
    base_url: str = "https://api.sendgrid.com"
    #: categories sent without ``Auto-Submitted: auto-generated`` (bulk mail)
    bulk_categories: tuple[str, ...] = ("marketing",)
    #: the Event Webhook's verification key (base64 DER or PEM, as SendGrid shows it
    #: under Mail Settings): read by the receipts endpoint, not by the adapter
    event_webhook_public_key: Optional[str] = None
    timeout: float = 10.0
    connect_timeout: float = 5.0
    verify: Any = True
    max_connections: int = 50
    name: str = "sendgrid"


def sendgrid_errors(body: dict[str, Any]) -> list[tuple[str, str]]:
    """``[(field, message), ...]`` of a SendGrid error body."""
    out = []
    errors = body.get("errors")
    if isinstance(errors, list):
        for e in errors[:10]:
            if isinstance(e, dict):
                out.append((str(e.get("field") or ""), str(e.get("message") or "")))
    return out


def _rate_reset(value: Optional[str], now: float) -> Optional[float]:
    try:
        reset = float(value) if value else None
    except ValueError:
        return None
    if reset is None or reset != reset:
        return None
    return max(0.0, reset - now) if reset > 1e9 else max(0.0, reset)  # a unix time, or seconds


class SendGridProvider(Provider):
    channel = "email"

    def __init__(self, config: SendGridConfig, *, client: Optional[httpx.AsyncClient] = None) -> None:
        self.config = config
        self.name = config.name
        self._headers = {"authorization": f"Bearer {config.api_key}", "content-type": "application/json",
                         "accept": "application/json"}
        #: sends, straight through the client's transport (None: through the client given)
        self._route: Optional[Route] = None
        if client is None:
            client, direct = direct_client(config)
            if direct is not None:
                self._route = direct.route("POST", "/v3/mail/send", headers=self._headers)
        self._client = client
        sender: dict[str, str] = {"email": config.from_addr}
        if config.from_name:
            sender["name"] = config.from_name
        self._from = sender

    def build_body(self, delivery: Delivery) -> dict[str, Any]:
        c = delivery.content or {}
        text, html = email_bodies(c)
        content = []
        if text is not None and str(text) != "":
            content.append({"type": "text/plain", "value": str(text)})
        if html:
            content.append({"type": "text/html", "value": str(html)})
        if not content:  # SendGrid refuses an empty content list or an empty value
            content.append({"type": "text/plain", "value": " "})
        headers = {"X-Notify-Id": delivery.delivery_id}
        if delivery.category not in self.config.bulk_categories:
            headers["Auto-Submitted"] = "auto-generated"
        headers.update(unsubscribe_headers(c))
        body: dict[str, Any] = {
            "from": self._from,
            "subject": str(c.get("subject") or ""),
            "personalizations": [{"to": [{"email": delivery.address}]}],
            "content": content,
            "headers": headers,
        }
        if delivery.category:
            body["categories"] = [str(delivery.category)[:255]]
        body["custom_args"] = {"notify_id": delivery.delivery_id}
        if self.config.reply_to:
            body["reply_to"] = {"email": self.config.reply_to}
        return body

    async def send(self, delivery: Delivery) -> SendResult:
        if "@" not in (delivery.address or ""):
            return SendResult(AttemptResult.PERMANENT_ERROR, self.name, error="no e-mail address",
                              permanent_kind=PermanentKind.INVALID_ADDRESS)
        route = self._route
        if route is not None:
            return await timed_send(self.name, lambda: route.send(orjson.dumps(self.build_body(delivery))), self._map)
        return await timed_send(self.name, lambda: self._client.post(
            "/v3/mail/send", content=orjson.dumps(self.build_body(delivery)), headers=self._headers), self._map)

    def _map(self, resp: Reply, latency_ms: float) -> SendResult:
        status = resp.status_code
        name = self.name
        if 200 <= status < 300:
            msg_id = (resp.headers.get("x-message-id") or "").strip() or None
            return SendResult(AttemptResult.ACCEPTED, name, provider_msg_id=msg_id, latency_ms=latency_ms,
                              error=None if msg_id else f"{status} without X-Message-Id (receipts cannot match)")
        errors = sendgrid_errors(response_json(resp))
        detail = "; ".join(f"{f}: {m}" if f else m for f, m in errors) or resp.reason_phrase
        error = f"{status} {detail}".strip()[:300]
        retry_after = parse_retry_after(resp.headers.get("retry-after"))
        if status == 429:
            if retry_after is None:
                retry_after = _rate_reset(resp.headers.get("x-ratelimit-reset"), time.time())
            return SendResult(AttemptResult.RATE_LIMITED, name, error=error, retry_after=retry_after,
                              latency_ms=latency_ms)
        if status in (401, 403):
            return SendResult(AttemptResult.TRANSIENT_ERROR, name, error=f"auth: {error}"[:300], fault=Fault.CONFIG,
                              latency_ms=latency_ms)
        if status >= 500 or status == 408:
            return SendResult(AttemptResult.TRANSIENT_ERROR, name, error=error, retry_after=retry_after,
                              latency_ms=latency_ms)
        kind = PermanentKind.INVALID_REQUEST
        if any(".to." in f or f.endswith(".to") for f, _ in errors):
            kind = PermanentKind.INVALID_ADDRESS
        return SendResult(AttemptResult.PERMANENT_ERROR, name, error=error, permanent_kind=kind, latency_ms=latency_ms)

    async def close(self) -> None:
        await self._client.aclose()
