"""SMS provider B: a JSON vendor API with a client reference.

Wire protocol (the shape most JSON SMS aggregators share):

* ``POST /v1/sms/send`` with ``X-Api-Key: <key>`` and JSON
  ``{"to", "text", "client_ref", "sender"?, "callback_url"?}`` → 200/202
  ``{"message_id", "status": "accepted"}``. ``client_ref`` is our
  ``delivery_id``; the vendor de-duplicates on it (a repeat answers the
  original ``message_id`` with ``"duplicate": true``), which makes a resend
  after TIMEOUT_UNKNOWN safe with this vendor.
* Errors: ``{"error": "<code>", "message"}``: ``invalid_number`` →
  PERMANENT_ERROR ``invalid_number``; ``opted_out`` → ``opted_out``; 401
  (bad key) → TRANSIENT_ERROR ``auth: …``; 429 + ``Retry-After`` →
  RATE_LIMITED; 5xx → TRANSIENT_ERROR.
* ``GET /v1/sms/status?client_ref=<delivery_id>`` (or ``?message_id=``) →
  ``{"message_id", "client_ref", "status": accepted|sent|delivered|failed|expired}``
  or 404 ``{"error": "not_found"}``: reconciliation by our key.
* Delivery receipts are POSTed to ``callback_url`` signed with HMAC-SHA256
  over ``"<timestamp>.<body>"`` (see :mod:`adapters.receipts`).

A send goes straight through the aiohttp session of the adapter's client
(:class:`adapters._http.Route`), the same request as through ``httpx.AsyncClient``;
queries go through the client; a client given to the constructor is used for
everything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import httpx

from pipeline.models import AttemptResult, Delivery

from ._http import Reply, Route, direct_client, json_body, query_error, response_json, timed_send
from .base import PermanentKind, Provider, QueryResult, QueryStatus, SendResult, parse_retry_after

__all__ = ["VendorSmsConfig", "VendorSmsProvider", "vendor_status_to_query"]


@dataclass
class VendorSmsConfig:
    api_key: str
    base_url: str
    sender: Optional[str] = None
    callback_url: Optional[str] = None
    timeout: float = 10.0
    connect_timeout: float = 5.0
    verify: Any = True
    max_connections: int = 50
    name: str = "smsvendor"


def vendor_status_to_query(status: str) -> str:
    s = (status or "").lower()
    if s == "delivered":
        return QueryStatus.DELIVERED
    if s in ("failed", "expired", "rejected", "undelivered"):
        return QueryStatus.UNDELIVERED
    return QueryStatus.ACCEPTED


class VendorSmsProvider(Provider):
    channel = "sms"

    def __init__(self, config: VendorSmsConfig, *, client: Optional[httpx.AsyncClient] = None) -> None:
        self.config = config
        self.name = config.name
        #: sends, straight through the client's transport (None: through the client given)
        self._route: Optional[Route] = None
        if client is None:
            client, direct = direct_client(config, headers={"x-api-key": config.api_key})
            if direct is not None:
                self._route = direct.route("POST", "/v1/sms/send", headers={"content-type": "application/json"})
        self._client = client

    def build_body(self, delivery: Delivery) -> dict[str, Any]:
        body: dict[str, Any] = {
            "to": delivery.address,
            "text": str((delivery.content or {}).get("body") or ""),
            "client_ref": delivery.delivery_id,
        }
        if self.config.sender:
            body["sender"] = self.config.sender
        if self.config.callback_url:
            body["callback_url"] = self.config.callback_url
        return body

    async def send(self, delivery: Delivery) -> SendResult:
        route = self._route
        if route is not None:
            return await timed_send(self.name, lambda: route.send(json_body(self.build_body(delivery))), self._map)
        return await timed_send(self.name, lambda: self._client.post("/v1/sms/send", json=self.build_body(delivery)),
                                self._map)

    def _map(self, resp: Reply, latency_ms: float) -> SendResult:
        status = resp.status_code
        body = response_json(resp)
        if 200 <= status < 300:
            if body.get("message_id"):
                return SendResult(AttemptResult.ACCEPTED, self.name, provider_msg_id=str(body["message_id"]), latency_ms=latency_ms)
            return SendResult(AttemptResult.TIMEOUT_UNKNOWN, self.name, error=f"{status} without message_id", latency_ms=latency_ms)
        code = str(body.get("error") or "")
        error = f"{status} {code} {body.get('message') or resp.reason_phrase}".strip()[:300]
        retry_after = parse_retry_after(resp.headers.get("retry-after"))
        if status == 429:
            return SendResult(AttemptResult.RATE_LIMITED, self.name, error=error, retry_after=retry_after, latency_ms=latency_ms)
        if status >= 500 or status in (401, 403, 408):
            if status in (401, 403):
                error = "auth: " + error
            return SendResult(AttemptResult.TRANSIENT_ERROR, self.name, error=error, retry_after=retry_after, latency_ms=latency_ms)
        kind = {
            "invalid_number": PermanentKind.INVALID_NUMBER,
            "opted_out": PermanentKind.OPTED_OUT,
        }.get(code, PermanentKind.INVALID_REQUEST if code == "invalid_request" else PermanentKind.REJECTED)
        return SendResult(AttemptResult.PERMANENT_ERROR, self.name, error=error, permanent_kind=kind, latency_ms=latency_ms)

    async def query(self, delivery_id: str, provider_msg_id: Optional[str] = None) -> QueryResult:
        params = {"client_ref": delivery_id} if delivery_id else {"message_id": provider_msg_id or ""}
        try:
            resp = await self._client.get("/v1/sms/status", params=params)
        except Exception as exc:  # noqa: BLE001
            return query_error(self.name, f"{type(exc).__name__}: {exc}", provider_msg_id)
        if resp.status_code == 404:
            return QueryResult(False, provider_msg_id, QueryStatus.NOT_FOUND, provider=self.name)
        if resp.status_code != 200:
            return query_error(self.name, f"{resp.status_code} {resp.text[:100]}", provider_msg_id)
        body = response_json(resp)
        return QueryResult(
            found=True,
            provider_msg_id=str(body.get("message_id") or provider_msg_id or "") or None,
            status=vendor_status_to_query(str(body.get("status", ""))),
            error=body.get("error"),
            provider=self.name,
        )

    async def close(self) -> None:
        await self._client.aclose()
