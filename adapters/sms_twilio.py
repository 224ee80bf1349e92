"""SMS provider A: Twilio Programmable Messaging (REST API 2010-04-01).

Wire protocol: ``POST /2010-04-01/Accounts/{AccountSid}/Messages.json``,
form-encoded ``To``, ``From`` (or ``MessagingServiceSid``), ``Body``,
``StatusCallback``; HTTP Basic auth ``AccountSid:AuthToken``. 201 answers a
Message resource ``{"sid": "SM…", "status": "queued", …}``; errors answer
``{"code": 21211, "message", "more_info", "status": 400}``. Status query:
``GET /2010-04-01/Accounts/{AccountSid}/Messages/{Sid}.json``.

Error codes: 21211 (invalid To), 21614 (not a mobile number), 21612 (cannot
route) → PERMANENT_ERROR ``invalid_number``; 21610 (recipient replied STOP) →
``opted_out``; 20003 (authentication) → TRANSIENT_ERROR ``auth: …``; 429 /
20429 → RATE_LIMITED with ``Retry-After``; 21408 (permission to send to the
number's region is not enabled on *our account*) → TRANSIENT_ERROR ``route: …``
with ``fault="route"``: the number is fine and another SMS provider may take
it (failover), and Twilio itself is healthy (the breaker does not count it).

Idempotency: Twilio's Messages API takes no idempotency key, so a blind resend
after a timeout can send twice. We send our key in the header named by
``idempotency_header`` (Twilio ignores unknown headers) and, when
``reconcile_param`` is set, reconcile by listing
``Messages.json?<reconcile_param>=<delivery_id>``: an extension that the
simulator implements. Against the real Twilio leave ``reconcile_param`` unset:
a query without ``provider_msg_id`` then answers ``supported=False`` and the
pipeline must not resend blindly (REVIEW, or resend accepting a duplicate).

Transport: a send goes straight through the aiohttp session of the adapter's
client (:class:`adapters._http.Route`: the URL, ``Authorization``, ``Accept`` and
``Content-Type`` built once by the client; the form body and the idempotency
header per call), the same request as through ``httpx.AsyncClient`` for 0.3-0.4 ms
less CPU a message (this is the OTP route); queries go through the client.
A client given to the constructor is used for everything, as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import httpx

from pipeline.models import AttemptResult, Delivery

from ._http import Reply, Route, direct_client, form_body, query_error, response_json, timed_send
from .base import Fault, PermanentKind, Provider, QueryResult, QueryStatus, SendResult, parse_retry_after

__all__ = ["TwilioConfig", "TwilioSmsProvider", "twilio_status_to_query"]

INVALID_NUMBER_CODES = frozenset({21211, 21614, 21612, 21217, 21401, 21407})
OPTED_OUT_CODES = frozenset({21610})
AUTH_CODES = frozenset({20003, 20005})
RATE_CODES = frozenset({20429, 14107})
#: the account may not send to this destination (geo permissions): another provider may
ROUTE_CODES = frozenset({21408})


@dataclass
class TwilioConfig:
    account_sid: str
    auth_token: str
    from_number: Optional[str] = None
    messaging_service_sid: Optional[str] = None
    base_url: str = "https://api.twilio.com"
    status_callback: Optional[str] = None  #: our receipts endpoint (signed callbacks)
    idempotency_header: str = "X-Notify-Idempotency-Key"
    #: list-by-key parameter for reconciliation (simulator extension); None for real Twilio
    reconcile_param: Optional[str] = None
    timeout: float = 10.0
    connect_timeout: float = 5.0
    verify: Any = True
    max_connections: int = 50
    name: str = "twilio"


def twilio_status_to_query(status: str) -> str:
    s = (status or "").lower()
    if s in ("delivered", "read"):
        return QueryStatus.DELIVERED
    if s in ("undelivered", "failed"):
        return QueryStatus.UNDELIVERED
    if s == "canceled":  # never left Twilio
        return QueryStatus.NOT_FOUND
    return QueryStatus.ACCEPTED  # accepted, scheduled, queued, sending, sent, receiving, received


class TwilioSmsProvider(Provider):
    channel = "sms"

    def __init__(self, config: TwilioConfig, *, client: Optional[httpx.AsyncClient] = None) -> None:
        if not (config.from_number or config.messaging_service_sid):
            raise ValueError("TwilioConfig needs from_number or messaging_service_sid")
        self.config = config
        self.name = config.name
        self._auth = httpx.BasicAuth(config.account_sid, config.auth_token)
        self._prefix = f"/2010-04-01/Accounts/{config.account_sid}"
        #: sends, straight through the client's transport (None: through the client given)
        self._route: Optional[Route] = None
        if client is None:
            client, direct = direct_client(config)
            if direct is not None:
                self._route = direct.route("POST", f"{self._prefix}/Messages.json", auth=self._auth, headers={
                    "accept": "application/json", "content-type": "application/x-www-form-urlencoded"})
        self._client = client

    def build_form(self, delivery: Delivery) -> dict[str, str]:
        form = {"To": delivery.address, "Body": str((delivery.content or {}).get("body") or "")}
        if self.config.messaging_service_sid:
            form["MessagingServiceSid"] = self.config.messaging_service_sid
        if self.config.from_number:
            form["From"] = self.config.from_number
        if self.config.status_callback:
            form["StatusCallback"] = self.config.status_callback
        return form

    async def send(self, delivery: Delivery) -> SendResult:
        route = self._route
        if route is not None:
            return await timed_send(self.name, lambda: route.send(
                form_body(self.build_form(delivery)), ((self.config.idempotency_header, delivery.delivery_id),)),
                self._map)
        return await timed_send(self.name, lambda: self._client.post(
            f"{self._prefix}/Messages.json",
            data=self.build_form(delivery),
            auth=self._auth,
            headers={self.config.idempotency_header: delivery.delivery_id, "accept": "application/json"},
        ), self._map)

    def _map(self, resp: Reply, latency_ms: float) -> SendResult:
        status = resp.status_code
        body = response_json(resp)
        if 200 <= status < 300 and body.get("sid"):
            return SendResult(AttemptResult.ACCEPTED, self.name, provider_msg_id=str(body["sid"]), latency_ms=latency_ms)
        if 200 <= status < 300:  # taken, but we cannot tell which message it is
            return SendResult(
                AttemptResult.TIMEOUT_UNKNOWN, self.name, error=f"{status} without a message sid", latency_ms=latency_ms
            )
        code = body.get("code")
        if isinstance(code, bool) or not isinstance(code, (int, str)):
            code = None  # Twilio's codes are numbers; anything else matches none (and is never looked up)
        error = f"{status} {code or ''} {body.get('message') or resp.reason_phrase}".strip()[:300]
        retry_after = parse_retry_after(resp.headers.get("retry-after"))
        if status == 429 or code in RATE_CODES:
            return SendResult(AttemptResult.RATE_LIMITED, self.name, error=error, retry_after=retry_after, latency_ms=latency_ms)
        if code in INVALID_NUMBER_CODES:
            return SendResult(
                AttemptResult.PERMANENT_ERROR, self.name, error=error, permanent_kind=PermanentKind.INVALID_NUMBER, latency_ms=latency_ms
            )
        if code in ROUTE_CODES:
            return SendResult(AttemptResult.TRANSIENT_ERROR, self.name, error=f"route: {error}"[:300],
                              fault=Fault.ROUTE, latency_ms=latency_ms)
        if code in OPTED_OUT_CODES:
            return SendResult(
                AttemptResult.PERMANENT_ERROR, self.name, error=error, permanent_kind=PermanentKind.OPTED_OUT, latency_ms=latency_ms
            )
        if status >= 500 or status in (401, 403, 408) or code in AUTH_CODES:
            if status in (401, 403) or code in AUTH_CODES:
                error = "auth: " + error
            return SendResult(AttemptResult.TRANSIENT_ERROR, self.name, error=error, retry_after=retry_after, latency_ms=latency_ms)
        return SendResult(
            AttemptResult.PERMANENT_ERROR, self.name, error=error, permanent_kind=PermanentKind.REJECTED, latency_ms=latency_ms
        )

    async def query(self, delivery_id: str, provider_msg_id: Optional[str] = None) -> QueryResult:
        try:
            if provider_msg_id:
                resp = await self._client.get(f"{self._prefix}/Messages/{provider_msg_id}.json", auth=self._auth)
                if resp.status_code == 404:
                    return QueryResult(False, provider_msg_id, QueryStatus.NOT_FOUND, provider=self.name)
                if resp.status_code != 200:
                    return query_error(self.name, f"{resp.status_code} {resp.text[:100]}", provider_msg_id)
                msg = response_json(resp)
            elif self.config.reconcile_param:
                resp = await self._client.get(
                    f"{self._prefix}/Messages.json",
                    params={self.config.reconcile_param: delivery_id, "PageSize": "20"},
                    auth=self._auth,
                )
                if resp.status_code != 200:
                    return query_error(self.name, f"{resp.status_code} {resp.text[:100]}")
                messages = response_json(resp).get("messages") or []
                if not messages:
                    return QueryResult(False, None, QueryStatus.NOT_FOUND, provider=self.name)
                msg = messages[0]  # newest first, as Twilio lists
            else:
                return await super().query(delivery_id, provider_msg_id)
        except Exception as exc:  # noqa: BLE001
            return query_error(self.name, f"{type(exc).__name__}: {exc}", provider_msg_id)
        status = twilio_status_to_query(str(msg.get("status", "")))
        return QueryResult(
            found=status != QueryStatus.NOT_FOUND,
            provider_msg_id=msg.get("sid") or provider_msg_id,
            status=status,
            error=str(msg["error_code"]) if msg.get("error_code") else None,
            provider=self.name,
        )

    async def close(self) -> None:
        await self._client.aclose()
