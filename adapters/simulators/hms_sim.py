"""Huawei Push Kit simulator (server API v1 with its OAuth token endpoint), aiohttp.

* ``POST /oauth2/v3/token``: form ``grant_type=client_credentials&client_id&client_secret``
  → ``{"access_token", "expires_in", "token_type": "Bearer"}``; a wrong client id or
  secret → 401 ``{"error": 1101, "sub_error", "error_description": "invalid client…"}``,
  another grant type → 400.
* ``POST /v1/{appId}/messages:send`` with ``Authorization: Bearer <access token>``
  → ``{"code": "80000000", "msg": "Success", "requestId"}``. An unknown access token
  → 401 80200001 (Oauth authentication error), an expired one (:meth:`HmsSim.expire_tokens`,
  ``token_lifetime``) → 401 80200003 (Oauth Token expired); another app id in the URL
  → 403 80300002 (no permission to send for the app).
* As Push Kit checks a message: ``message.token`` a list of 1..1000 strings (else 400
  80300010), ``data`` a string (JSON text, not a map: else 400 80100003),
  ``android.notification`` with ``title`` and ``body`` strings (80100003),
  ``android.urgency`` HIGH or NORMAL (80100001), the message without its tokens at
  most 4096 bytes (400 80300008, message body too large).
* Invalid tokens: ``bad…``/``gone…`` prefixes, a ``#sim=invalid`` marker and every
  token in ``sim.invalid_tokens`` (what a test marks invalid). Every token of the
  request invalid → 400 80300007; some → 200 80100000 with ``msg`` the JSON
  ``{"success", "failure", "illegal_tokens": [...]}``.
* ``"validate_only": true``: checked, nothing delivered (ledger op ``validate``);
  ``notify-auth-probe`` is a token no device holds (80300007): what
  ``notify providers check`` sends.
* The mode and the profile (:mod:`.common`): ``throttle…`` tokens and the ``ratelimit``
  mode → 429 with Retry-After (the quota); ``error…`` → 500 81000001 (internal error);
  ``flaky…`` and the ``down`` mode → 503 (Huawei: traffic control), or the mode's
  ``status``; ``slow…``, ``hang…`` (accepted, then no answer: TIMEOUT_UNKNOWN); the
  realistic profile's latency (p50 ~30 ms) and random failures.

The ledger's ``key`` is our delivery id (``data.notify_id``, else ``android.bi_tag``).

Receipts (回执): after a message is accepted, and ``receipt_delay`` later, the simulator
POSTs Push Kit's receipt callback to ``receipts_url`` (what the app's receipt
configuration in AppGallery Connect names): ``{"statuses": [{"biTag", "appid",
"token", "status", "timestamp" (ms), "requestId"}]}``, one status per valid token,
status 0 (delivered), or 2 (app not installed) for the ``undelivered`` scenario and
the profile's ``undelivered_rate``, with ``X-HUAWEI-CALLBACK-ID: timestamp=<ms>;
nonce=<UUID>; value=base64(HMAC-SHA256(receipt_key, timestamp + nonce +
receipt_username))`` (:func:`adapters.receipts.hms_callback_id`): the callback user
name (default ``notify-sim``) and key (default: random) of that configuration. A
callback answered with a 5xx or not at all is sent once more, the same.
:meth:`HmsSim.receipt_body` and :meth:`HmsSim.signed` build one for a test.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import secrets
import time
from typing import Any, Optional

import orjson
from aiohttp import web

from ..receipts import HMS_CALLBACK_HEADER, HMS_SIM_USERNAME, hms_callback_id
from .common import HttpSim, SimProfile, post_receipt, text_scenario, token_scenario

__all__ = ["HmsSim"]

#: Push Kit's limit on a message without its tokens (80300008 over it)
MAX_MESSAGE_BYTES = 4096
MAX_TOKENS = 1000


class HmsSim(HttpSim):
    name = "hms"

    def __init__(self, profile: Optional[SimProfile] = None, *, app_id: str = "104857601", token_lifetime: int = 3600,
                 receipt_username: str = HMS_SIM_USERNAME, receipt_key: Optional[str] = None, **kw: Any) -> None:
        super().__init__(profile, **kw)
        #: the receipt configuration's callback user name and key (X-HUAWEI-CALLBACK-ID)
        self.receipt_username = receipt_username
        self.receipt_key = receipt_key or secrets.token_hex(24)
        self.app_id = app_id
        self.client_id = app_id  # an app's OAuth client ID is its app id in AppGallery Connect
        self.client_secret = secrets.token_hex(32)
        self.token_lifetime = token_lifetime
        self._tokens: dict[str, float] = {}  # access token → expiry (unix s)
        self._ids = itertools.count(1)
        self.token_grants = 0
        #: push tokens answered as invalid (80300007 / 80100000), besides the bad…/gone… prefixes
        self.invalid_tokens: set[str] = set()

    @property
    def token_url(self) -> str:
        return f"{self.base_url}/oauth2/v3/token"

    def credentials(self) -> dict[str, Any]:
        return {"client_id": self.client_id, "client_secret": self.client_secret, "app_id": self.app_id}

    def receipt_credentials(self) -> dict[str, Any]:
        """The receipt configuration's callback user name and key (``receipt_username``,
        the secret behind ``receipt_key_env`` of a ``[providers.<name>]`` of kind hms)."""
        return {"receipt_username": self.receipt_username, "receipt_key": self.receipt_key}

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/oauth2/v3/token", self._token)
        app.router.add_post("/v1/{app_id}/messages:send", self._send)

    def expire_tokens(self) -> None:
        """Every access token issued so far expires now (80200003 on its next use)."""
        now = time.time()
        self._tokens = {t: min(exp, now - 1) for t, exp in self._tokens.items()}

    def _request_id(self) -> str:
        return f"{int(time.time() * 1000)}{next(self._ids):011d}"

    def _answer(self, status: int, code: str, msg: str, headers: Optional[dict[str, str]] = None) -> web.Response:
        return web.json_response({"code": code, "msg": msg, "requestId": self._request_id()}, status=status,
                                 headers=headers)

    # ------------------------------------------------------------------ OAuth

    async def _token(self, request: web.Request) -> web.Response:
        form = await request.post()
        self.core.record(op="oauth", method="POST", path=request.path, key="")
        if form.get("grant_type") != "client_credentials":
            return web.json_response({"error": 1102, "sub_error": 20003,
                                      "error_description": "unsupported grant_type"}, status=400)
        if form.get("client_id") != self.client_id:
            return web.json_response({"error": 1101, "sub_error": 20001, "error_description": "invalid client_id"},
                                     status=401)
        if form.get("client_secret") != self.client_secret:
            return web.json_response({"error": 1101, "sub_error": 20002,
                                      "error_description": "invalid client_secret"}, status=401)
        token = "DQEBA" + secrets.token_urlsafe(32)
        self._tokens[token] = time.time() + self.token_lifetime
        self.token_grants += 1
        return web.json_response({"access_token": token, "expires_in": self.token_lifetime, "token_type": "Bearer"})

    # ------------------------------------------------------------------ send

    def _invalid(self, token: str, text: Any) -> bool:
        return (token in self.invalid_tokens or token_scenario(token) in ("bad_token", "gone")
                or token.startswith("notify-auth-probe") or text_scenario(text) == "invalid")

    async def _send(self, request: web.Request) -> web.StreamResponse:
        core = self.core
        _, body = await self.read_json(request)
        message = body.get("message") if isinstance(body, dict) else None
        message = message if isinstance(message, dict) else {}
        android = message.get("android") if isinstance(message.get("android"), dict) else {}
        notification = android.get("notification")
        tokens = message.get("token")
        data = message.get("data")
        try:
            data_obj = orjson.loads(data) if isinstance(data, str) else {}
        except orjson.JSONDecodeError:
            data_obj = {}
        key = str((data_obj.get("notify_id") if isinstance(data_obj, dict) else None) or android.get("bi_tag") or "")
        first = tokens[0] if isinstance(tokens, list) and tokens and isinstance(tokens[0], str) else ""
        entry: dict[str, Any] = {"op": "send", "method": "POST", "path": request.path, "key": key, "to": first}

        def refuse(status: int, code: str, msg: str, **extra: Any) -> web.Response:
            core.record(**entry, status=status, outcome=code, accepted=False, **extra)
            return self._answer(status, code, msg)

        auth = request.headers.get("Authorization", "")
        bearer = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
        expiry = self._tokens.get(bearer)
        if expiry is None:
            return refuse(401, "80200001", "Oauth authentication error")
        if expiry < time.time():
            return refuse(401, "80200003", "Oauth Token expired")
        if request.match_info["app_id"] != self.app_id:
            return refuse(403, "80300002", "There is no permission to send a message to a specified device")
        if not isinstance(body, dict) or not message:
            return refuse(400, "80100003", "Incorrect message structure")
        if not isinstance(tokens, list) or not 1 <= len(tokens) <= MAX_TOKENS or not all(
                isinstance(t, str) and t for t in tokens):
            return refuse(400, "80300010", "The number of tokens in the message body exceeds the default value")
        if data is not None and not isinstance(data, str):
            return refuse(400, "80100003", "Incorrect message structure: message.data is a string")
        if notification is not None and not (isinstance(notification, dict)
                                             and isinstance(notification.get("title"), str)
                                             and isinstance(notification.get("body"), str)):
            return refuse(400, "80100003", "Incorrect message structure: android.notification needs title and body")
        if android.get("urgency", "NORMAL") not in ("HIGH", "NORMAL"):
            return refuse(400, "80100001", "Some request parameters are incorrect: android.urgency")
        if len(orjson.dumps({k: v for k, v in message.items() if k != "token"})) > MAX_MESSAGE_BYTES:
            return refuse(400, "80300008", "The message body size exceeds the default value")
        text = notification.get("body") if isinstance(notification, dict) else None
        bad = [t for t in tokens if self._invalid(t, text)]
        validate = body.get("validate_only") is True
        if validate:
            entry["op"] = "validate"
        if len(bad) == len(tokens):
            return refuse(400, "80300007", "All the tokens are invalid", cause="invalid_token")
        if validate:
            core.record(**entry, status=200, outcome="validated", accepted=False)
            return self._answer(200, "80000000", "Success")
        d = core.decide(key or first, token_scenario(first) or text_scenario(text))
        if d.delay:
            await asyncio.sleep(d.delay)
        if d.action == "error":
            core.record(**entry, status=d.status, outcome="error", cause=d.cause, accepted=False)
            if d.status == 500:
                return self._answer(500, "81000001", "Internal error")
            return web.Response(status=d.status, text="Service Unavailable: traffic control")
        if d.action == "ratelimit":
            ra = str(max(1, math.ceil(d.retry_after or 1)))
            core.record(**entry, status=429, outcome="ratelimited", cause=d.cause, accepted=False, retry_after=ra)
            return web.json_response({"msg": "Too Many Requests: the app's push quota is exceeded",
                                      "requestId": self._request_id()}, status=429, headers={"Retry-After": ra})
        if d.action == "permanent":  # a scenario of the recipient: its token is not valid
            return refuse(400, "80300007", "All the tokens are invalid", cause=d.cause)
        request_id = self._request_id()
        core.messages[request_id] = {"request_id": request_id, "key": key, "tokens": tokens, "message": message,
                                     "at": time.time()}
        if key:
            core.by_key[key] = request_id
        delivered = [t for t in tokens if t not in bad]
        core.spawn(self._receipts(request_id, key, delivered, 2 if d.undelivered else 0))
        await self.accepted(entry, d, request_id)
        if bad:
            msg = orjson.dumps({"success": len(tokens) - len(bad), "failure": len(bad), "illegal_tokens": bad}).decode()
            return web.json_response({"code": "80100000", "msg": msg, "requestId": request_id})
        return web.json_response({"code": "80000000", "msg": "Success", "requestId": request_id})

    # ------------------------------------------------------------------ receipts

    def receipt_body(self, request_id: str, status: int = 0, *, tokens: Optional[list[str]] = None,
                     bi_tag: Optional[str] = None, timestamp_ms: Optional[int] = None) -> bytes:
        """Push Kit's receipt callback body for the message ``request_id`` (one status per token)."""
        msg = self.core.messages.get(request_id) or {}
        tokens = tokens if tokens is not None else list(msg.get("tokens") or ["token"])
        ts = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
        tag = bi_tag if bi_tag is not None else str(msg.get("key") or "")
        return orjson.dumps({"statuses": [{"biTag": tag, "appid": self.app_id, "token": t, "status": status,
                                           "timestamp": ts, "requestId": request_id} for t in tokens]})

    def signed(self, timestamp: Optional[str] = None, nonce: Optional[str] = None) -> dict[str, str]:
        """The headers of a receipt callback: JSON, and a fresh X-HUAWEI-CALLBACK-ID."""
        return {"Content-Type": "application/json",
                HMS_CALLBACK_HEADER: hms_callback_id(self.receipt_key, self.receipt_username, timestamp, nonce)}

    async def _receipts(self, request_id: str, key: str, tokens: list[str], status: int) -> None:
        await asyncio.sleep(self.core.receipt_delay())
        msg = self.core.messages.get(request_id)
        if msg is None or not tokens:
            return
        msg["status"] = "delivered" if status == 0 else f"undelivered {status}"
        if not self.receipts_url or self.session is None:
            return
        body = self.receipt_body(request_id, status, tokens=tokens, bi_tag=key)
        await post_receipt(self.session, self.core, self.receipts_url, body=body, headers=self.signed(),
                           info={"msg_id": request_id, "key": key, "status_sent": status})
