"""Twilio Messages API simulator (provider A), aiohttp.

* ``POST /2010-04-01/Accounts/{AccountSid}/Messages.json`` (form: To, From or
  MessagingServiceSid, Body, StatusCallback) with HTTP Basic auth
  ``AccountSid:AuthToken`` (401 code 20003 otherwise) → 201 Message resource.
* ``GET /2010-04-01/Accounts/{AccountSid}.json`` → the Account resource (``status``
  ``active``), 401 code 20003 without the right Basic auth: a credentials check
  that sends nothing (``notify providers check``; ledger op ``auth``).
* ``GET …/Messages/{Sid}.json`` → the resource (status ``queued`` → ``sent`` →
  ``delivered`` | ``undelivered``), 404 code 20404.
* ``GET …/Messages.json?To=&NotifyIdempotencyKey=`` lists messages, newest
  first. Filtering by ``NotifyIdempotencyKey`` (the value our adapter sends in
  the ``X-Notify-Idempotency-Key`` header) is a simulator extension that real
  Twilio lacks: it stands for "the provider can find a message by our key".
* Like Twilio, it does **not** de-duplicate: a resend creates a second message.
* Status callbacks (``sent``, then ``delivered``/``undelivered`` with
  ErrorCode 30003) are POSTed form-encoded to the message's StatusCallback
  (or the simulator's ``receipts_url``), signed with ``X-Twilio-Signature``.
* Scenarios by the last four digits of ``To``: 0001 → 400 code 21211
  (invalid number), 0002 → 429 (Retry-After) on the first call, 0003 → slow,
  0004 → accepted then no answer (the UNKNOWN case), 0005 → accepted then
  undelivered, 0006 → 503 on the first call, 0007 → always 500, 0008 → 400
  code 21610 (opted out), 0010 → 400 code 21408 (the account's geo
  permissions do not include the number's region; so does any number starting
  with one of ``blocked_regions``, e.g. ``("+44",)``). E.g. ``+15005550001``.
* Callbacks as Twilio sends them: to the StatusCallback URL as given, query
  string included and signed; with ``shared_key=(key_id, secret)`` signed
  HMAC-SHA256 with that SharedKey and named in
  ``X-Twilio-Webhooks-Signature-Settings: key=<id>,algorithm=HMAC_SHA256``;
  with ``repeat_callbacks=True`` every callback is posted twice, identical (as
  Twilio retries one whose answer it did not get).
"""

from __future__ import annotations

import asyncio
import math
import secrets
import time
from typing import Any, Optional
from urllib.parse import urlencode

from aiohttp import BasicAuth, web

from ..receipts import twilio_signature
from .common import HttpSim, SimProfile, phone_scenario, post_receipt, text_scenario

__all__ = ["TwilioSim", "RECONCILE_PARAM", "IDEMPOTENCY_HEADER"]

RECONCILE_PARAM = "NotifyIdempotencyKey"
#: a number ending so is in a region the account may not send to (code 21408)
REGION_SUFFIX = "0010"
IDEMPOTENCY_HEADER = "X-Notify-Idempotency-Key"


def _rfc2822(t: float) -> str:
    return time.strftime("%a, %d %b %Y %H:%M:%S +0000", time.gmtime(t))


def _error(status: int, code: int, message: str, headers: Optional[dict[str, str]] = None) -> web.Response:
    return web.json_response(
        {"code": code, "message": message, "more_info": f"https://www.twilio.com/docs/errors/{code}", "status": status},
        status=status,
        headers=headers,
    )


class TwilioSim(HttpSim):
    name = "twilio"

    def __init__(
        self,
        profile: Optional[SimProfile] = None,
        *,
        account_sid: Optional[str] = None,
        auth_token: Optional[str] = None,
        from_number: str = "+15005550006",
        blocked_regions: tuple[str, ...] = (),
        shared_key: Optional[tuple[str, str]] = None,
        repeat_callbacks: bool = False,
        **kw: Any,
    ) -> None:
        super().__init__(profile, **kw)
        self.blocked_regions = tuple(blocked_regions)
        self.shared_key = shared_key
        self.repeat_callbacks = repeat_callbacks
        self.account_sid = account_sid or "AC" + secrets.token_hex(16)
        self.auth_token = auth_token or secrets.token_hex(16)
        self.from_number = from_number

    def credentials(self) -> dict[str, Any]:
        return {"account_sid": self.account_sid, "auth_token": self.auth_token, "from_number": self.from_number}

    def add_routes(self, app: web.Application) -> None:
        base = "/2010-04-01/Accounts/{sid}"
        app.router.add_get(base + ".json", self._account)
        app.router.add_post(base + "/Messages.json", self._create)
        app.router.add_get(base + "/Messages.json", self._list)
        app.router.add_get(base + "/Messages/{msid}.json", self._fetch)

    # ------------------------------------------------------------------ auth

    def _authorized(self, request: web.Request) -> bool:
        if request.match_info.get("sid") != self.account_sid:
            return False
        try:
            auth = BasicAuth.decode(request.headers.get("Authorization", ""))
        except ValueError:
            return False
        return secrets.compare_digest(auth.login, self.account_sid) and secrets.compare_digest(auth.password, self.auth_token)

    def _resource(self, msg: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in msg.items() if not k.startswith("_")}
        out["uri"] = f"/2010-04-01/Accounts/{self.account_sid}/Messages/{msg['sid']}.json"
        return out

    # ------------------------------------------------------------------ account

    async def _account(self, request: web.Request) -> web.Response:
        """``GET /2010-04-01/Accounts/{sid}.json``: the Account resource, as Twilio
        answers it: what ``notify providers check`` asks to try the credentials."""
        ok = self._authorized(request)
        self.core.record(op="auth", method="GET", path=request.path, key="", status=200 if ok else 401)
        if not ok:
            return _error(401, 20003, "Authenticate")
        return web.json_response({
            "sid": self.account_sid, "friendly_name": "notify simulator", "status": "active", "type": "Full",
            "owner_account_sid": self.account_sid, "date_created": _rfc2822(time.time()),
            "uri": f"/2010-04-01/Accounts/{self.account_sid}.json",
        })

    # ------------------------------------------------------------------ create

    async def _create(self, request: web.Request) -> web.StreamResponse:
        core = self.core
        form = await request.post()
        key = request.headers.get(IDEMPOTENCY_HEADER, "")
        to = str(form.get("To", ""))
        entry: dict[str, Any] = {"op": "send", "method": "POST", "path": request.path, "key": key, "to": to}
        if not self._authorized(request):
            core.record(**entry, status=401, outcome="auth", accepted=False)
            return _error(401, 20003, "Authenticate")
        body = str(form.get("Body", ""))
        if not to:
            core.record(**entry, status=400, outcome="21604", accepted=False)
            return _error(400, 21604, "A 'To' phone number is required.")
        if not (form.get("From") or form.get("MessagingServiceSid")):
            core.record(**entry, status=400, outcome="21603", accepted=False)
            return _error(400, 21603, "A 'From' phone number is required.")
        if not body:
            core.record(**entry, status=400, outcome="21602", accepted=False)
            return _error(400, 21602, "Message body is required.")
        if to.endswith(REGION_SUFFIX) or any(to.startswith(r) for r in self.blocked_regions):
            core.record(**entry, status=400, outcome="21408", accepted=False)
            return _error(400, 21408, f"Permission to send an SMS has not been enabled for the region indicated by the 'To' number: {to}")
        d = core.decide(key or to, text_scenario(body) or phone_scenario(to))
        if d.delay:
            await asyncio.sleep(d.delay)
        if d.action == "error":
            core.record(**entry, status=d.status, outcome="error", cause=d.cause, accepted=False)
            code = 20503 if d.status == 503 else 20500
            return _error(d.status, code, "Service Unavailable" if d.status == 503 else "Internal Server Error")
        if d.action == "ratelimit":
            ra = str(max(1, math.ceil(d.retry_after or 1)))
            core.record(**entry, status=429, outcome="rate_limited", cause=d.cause, accepted=False, retry_after=ra)
            return _error(429, 20429, "Too Many Requests", {"Retry-After": ra})
        if d.action == "permanent":
            if d.scenario == "opted_out":
                core.record(**entry, status=400, outcome="21610", cause=d.cause, accepted=False)
                return _error(400, 21610, "Attempt to send to unsubscribed recipient")
            core.record(**entry, status=400, outcome="21211", cause=d.cause, accepted=False)
            return _error(400, 21211, f"The 'To' number {to} is not a valid phone number.")
        now = time.time()
        sid = "SM" + secrets.token_hex(16)
        msg: dict[str, Any] = {
            "sid": sid,
            "account_sid": self.account_sid,
            "to": to,
            "from": str(form.get("From") or self.from_number),
            "messaging_service_sid": form.get("MessagingServiceSid"),
            "body": body,
            "status": "queued",
            "direction": "outbound-api",
            "api_version": "2010-04-01",
            "num_segments": str(max(1, math.ceil(len(body) / 160))),
            "num_media": "0",
            "price": None,
            "price_unit": "USD",
            "error_code": None,
            "error_message": None,
            "date_created": _rfc2822(now),
            "date_updated": _rfc2822(now),
            "date_sent": None,
            "_key": key,
            "_t": now,
            "_callback": str(form.get("StatusCallback") or self.receipts_url or ""),
        }
        core.messages[sid] = msg
        if key:
            core.by_key[key] = sid
        core.spawn(self._lifecycle(sid, d.undelivered))
        await self.accepted(entry, d, sid, 201)
        return web.json_response(self._resource(msg), status=201)

    # ------------------------------------------------------------------ read

    async def _fetch(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _error(401, 20003, "Authenticate")
        msid = request.match_info["msid"]
        msg = self.core.messages.get(msid)
        self.core.record(op="query", method="GET", path=request.path, key=(msg or {}).get("_key", ""), msg_id=msid, status=200 if msg else 404)
        if msg is None:
            return _error(404, 20404, f"The requested resource {request.path} was not found")
        return web.json_response(self._resource(msg))

    async def _list(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _error(401, 20003, "Authenticate")
        key = request.query.get(RECONCILE_PARAM)
        to = request.query.get("To")
        msgs = [m for m in self.core.messages.values() if (key is None or m["_key"] == key) and (to is None or m["to"] == to)]
        msgs.sort(key=lambda m: m["_t"], reverse=True)
        size = int(request.query.get("PageSize", "50"))
        self.core.record(op="query", method="GET", path=request.path, key=key or "", status=200, found=len(msgs))
        return web.json_response({"messages": [self._resource(m) for m in msgs[:size]], "page": 0, "page_size": size})

    # ------------------------------------------------------------------ receipts

    async def _lifecycle(self, sid: str, undelivered: bool) -> None:
        total = self.core.receipt_delay()
        await asyncio.sleep(total / 3)
        msg = self.core.messages.get(sid)
        if msg is None:
            return
        msg["status"] = "sent"
        msg["date_sent"] = msg["date_updated"] = _rfc2822(time.time())
        await self._callback(msg)
        await asyncio.sleep(total * 2 / 3)
        if undelivered:
            msg.update(status="undelivered", error_code=30003, error_message="Unreachable destination handset")
        else:
            msg["status"] = "delivered"
        msg["date_updated"] = _rfc2822(time.time())
        await self._callback(msg)

    async def _callback(self, msg: dict[str, Any]) -> None:
        url = msg["_callback"]
        if not url or self.session is None:
            return
        params = {
            "AccountSid": self.account_sid,
            "ApiVersion": "2010-04-01",
            "From": msg["from"],
            "To": msg["to"],
            "MessageSid": msg["sid"],
            "SmsSid": msg["sid"],
            "MessageStatus": msg["status"],
            "SmsStatus": msg["status"],
        }
        if msg.get("error_code"):
            params["ErrorCode"] = str(msg["error_code"])
        headers = {
            "I-Twilio-Idempotency-Token": secrets.token_hex(16),
            "Content-Type": "application/x-www-form-urlencoded",
        }
        if self.shared_key is not None:
            key_id, secret = self.shared_key
            headers["X-Twilio-Signature"] = twilio_signature(secret, url, params, algorithm="HMAC_SHA256")
            headers["X-Twilio-Webhooks-Signature-Settings"] = f"key={key_id},algorithm=HMAC_SHA256"
        else:
            headers["X-Twilio-Signature"] = twilio_signature(self.auth_token, url, params)
        info = {"msg_id": msg["sid"], "key": msg["_key"], "status_sent": msg["status"]}
        body = urlencode(params).encode()
        for _ in range(2 if self.repeat_callbacks else 1):
            await post_receipt(self.session, self.core, url, body=body, headers=headers, info=info)
