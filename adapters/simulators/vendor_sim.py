"""JSON SMS vendor simulator (provider B), aiohttp.

* ``POST /v1/sms/send`` (``X-Api-Key``; 401 otherwise) with
  ``{"to", "text", "client_ref", "sender"?, "callback_url"?}`` → 200
  ``{"message_id", "status": "accepted"}``. De-duplicates on ``client_ref``:
  a repeat answers the original message with ``"duplicate": true`` and sends
  nothing new.
* ``GET /v1/sms/status?client_ref=`` (or ``?message_id=``) → the message's
  status (``accepted`` → ``delivered`` | ``failed``), 404 ``not_found``.
* Receipts: JSON ``{"message_id", "client_ref", "status", "error",
  "timestamp"}`` POSTed to ``callback_url`` (or the simulator's
  ``receipts_url``) with ``X-Vendor-Timestamp`` and ``X-Vendor-Signature:
  sha256=<hex HMAC-SHA256(webhook_secret, "<ts>.<body>")>``.
* Scenarios by the last four digits of ``to``, as the Twilio simulator
  (0001 invalid_number, 0002 429 first call, 0003 slow, 0004 hang,
  0005 undelivered, 0006 503 first call, 0007 always 500, 0008 opted_out).
"""

from __future__ import annotations

import asyncio
import math
import secrets
import time
from typing import Any, Optional

import orjson
from aiohttp import web

from ..receipts import vendor_signature_header
from .common import HttpSim, SimProfile, phone_scenario, post_receipt, text_scenario

__all__ = ["VendorSim"]


def _err(status: int, code: str, message: str, headers: Optional[dict[str, str]] = None) -> web.Response:
    return web.json_response({"error": code, "message": message}, status=status, headers=headers)


class VendorSim(HttpSim):
    name = "smsvendor"

    def __init__(
        self,
        profile: Optional[SimProfile] = None,
        *,
        api_key: Optional[str] = None,
        webhook_secret: Optional[str] = None,
        **kw: Any,
    ) -> None:
        super().__init__(profile, **kw)
        self.api_key = api_key or "vk_" + secrets.token_hex(16)
        self.webhook_secret = webhook_secret or secrets.token_hex(16)

    def credentials(self) -> dict[str, Any]:
        return {"api_key": self.api_key, "webhook_secret": self.webhook_secret}

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/sms/send", self._send)
        app.router.add_get("/v1/sms/status", self._status)

    def _authorized(self, request: web.Request) -> bool:
        return secrets.compare_digest(request.headers.get("X-Api-Key", ""), self.api_key)

    @staticmethod
    def _view(msg: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in msg.items() if not k.startswith("_")}

    async def _send(self, request: web.Request) -> web.StreamResponse:
        core = self.core
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            body = None
        if not isinstance(body, dict):
            body = {}
        key = str(body.get("client_ref") or "")
        to = str(body.get("to") or "")
        entry: dict[str, Any] = {"op": "send", "method": "POST", "path": request.path, "key": key, "to": to}
        if not self._authorized(request):
            core.record(**entry, status=401, outcome="unauthorized", accepted=False)
            return _err(401, "unauthorized", "missing or invalid X-Api-Key")
        text = body.get("text")
        if not to or not isinstance(text, str) or not text or not key:
            core.record(**entry, status=400, outcome="invalid_request", accepted=False)
            return _err(400, "invalid_request", "to, text and client_ref are required")
        d = core.decide(key, text_scenario(text) or phone_scenario(to))
        if d.delay:
            await asyncio.sleep(d.delay)
        if d.action == "error":
            core.record(**entry, status=d.status, outcome="unavailable", cause=d.cause, accepted=False)
            return _err(d.status, "unavailable", "temporarily unavailable")
        if d.action == "ratelimit":
            ra = str(max(1, math.ceil(d.retry_after or 1)))
            core.record(**entry, status=429, outcome="rate_limited", cause=d.cause, accepted=False, retry_after=ra)
            return _err(429, "rate_limited", "slow down", {"Retry-After": ra})
        if d.action == "permanent":
            code = "opted_out" if d.scenario == "opted_out" else "invalid_number"
            core.record(**entry, status=400, outcome=code, cause=d.cause, accepted=False)
            return _err(400, code, f"cannot send to {to}")
        existing = core.by_key.get(key)
        if existing is not None and existing in core.messages:
            msg = core.messages[existing]
            core.record(**entry, status=200, outcome="duplicate", cause=d.cause, accepted=True, duplicate=True, msg_id=existing)
            return web.json_response({"message_id": existing, "status": msg["status"], "duplicate": True})
        mid = "vm_" + secrets.token_hex(12)
        msg = {
            "message_id": mid,
            "client_ref": key,
            "to": to,
            "status": "accepted",
            "error": None,
            "created": time.time(),
            "_callback": str(body.get("callback_url") or self.receipts_url or ""),
            "_text": text,
        }
        core.messages[mid] = msg
        core.by_key[key] = mid
        core.spawn(self._lifecycle(mid, d.undelivered))
        await self.accepted(entry, d, mid)
        return web.json_response({"message_id": mid, "status": "accepted"})

    async def _status(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _err(401, "unauthorized", "missing or invalid X-Api-Key")
        ref = request.query.get("client_ref")
        mid = request.query.get("message_id")
        if ref:
            mid = self.core.by_key.get(ref)
        msg = self.core.messages.get(mid or "")
        self.core.record(op="query", method="GET", path=request.path, key=ref or (msg or {}).get("client_ref", ""), status=200 if msg else 404)
        if msg is None:
            return _err(404, "not_found", "no such message")
        return web.json_response(self._view(msg))

    async def _lifecycle(self, mid: str, undelivered: bool) -> None:
        await asyncio.sleep(self.core.receipt_delay())
        msg = self.core.messages.get(mid)
        if msg is None:
            return
        if undelivered:
            msg.update(status="failed", error="absent_subscriber")
        else:
            msg["status"] = "delivered"
        url = msg["_callback"]
        if not url or self.session is None:
            return
        ts = str(int(time.time()))
        body = orjson.dumps(
            {"message_id": mid, "client_ref": msg["client_ref"], "status": msg["status"], "error": msg["error"], "timestamp": float(ts)}
        )
        headers = {
            "Content-Type": "application/json",
            "X-Vendor-Timestamp": ts,
            "X-Vendor-Signature": vendor_signature_header(self.webhook_secret, ts, body),
        }
        await post_receipt(self.session, self.core, url, body=body, headers=headers, info={"msg_id": mid, "key": msg["client_ref"], "status_sent": msg["status"]})
