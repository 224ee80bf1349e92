"""Huawei Push Kit (HMS Core), server HTTP API v1: the vendor push channel of
Huawei phones, which ship without Google services (no FCM).

Wire protocol, as Huawei documents it and its own server SDK sends it:

* **OAuth** (client credentials, "Client Credentials" in the HMS Core OAuth 2.0
  guide, developer.huawei.com/consumer/en/doc/HMSCore-Guides/android-server-dev-0000001050040110):
  ``POST https://oauth-login.cloud.huawei.com/oauth2/v3/token``, form-encoded
  ``grant_type=client_credentials&client_id=<id>&client_secret=<secret>`` →
  ``{"access_token", "expires_in": 3600, "token_type": "Bearer"}``; Huawei flow-controls
  tokens requested too often, so the token is cached until ``token_refresh_margin``
  before ``expires_in`` (Huawei's sample SDK, github.com/HMS-Core/hms-push-serverdemo-python
  ``push_admin/_app.py``, renews 5 minutes early, as we do) and fetched by one caller at
  a time (single flight: concurrent senders wait for that fetch instead of stampeding).
* **Send** (same guide, "Downlink Message Sending"):
  ``POST https://push-api.cloud.huawei.com/v1/<appId>/messages:send`` (the guide now
  writes ``[clientid]``; Huawei's Python SDK puts the app id there and sends the same
  value as ``client_id``: ``app_id`` defaults to ``client_id``) with
  ``Authorization: Bearer <access token>`` and ``{"validate_only": false, "message":
  {"token": [<push token>], "data": "<JSON text>", "android": {"urgency", "ttl",
  "bi_tag", "notification": {"title", "body", "click_action": {"type": 3}}}}}``
  (``click_action.type`` 3: open the app; ``data`` is one string, not a map as in FCM;
  ``bi_tag`` comes back in the delivery receipts). The answer is ``{"code", "msg",
  "requestId"}``; ``code`` ``"80000000"`` / ``msg`` ``"Success"`` is success and
  ``requestId`` becomes ``provider_msg_id`` (the receipts carry it).

Result codes (developer.huawei.com/consumer/en/doc/doccenter-references/api/push-scenariozed-api-response
for the HTTP statuses and 80000000 / 80100000; HMS Core's own FAQ on the server's common
error codes, blog.csdn.net/HUAWEI_HMSCore/article/details/125866284 (in English:
segmentfault.com/a/1190000042188975), for 80200001 / 80300007 / 80300010 / 80200003 (the
access token lasts one hour); the code tables of threema-ch/push-relay ``src/push/hms.rs`` and
the civet148/gotools Huawei client for 80300002 / 80300008 (4 KB) / 81000001):

* 80000000 Success (200) → ACCEPTED, ``provider_msg_id`` = ``requestId``;
* 80100000, some tokens failed (partial success): ``msg`` is JSON naming them
  (``{"success", "failure", "illegal_tokens": [...]}``): ours among them → PERMANENT
  ``bad_token``, else ACCEPTED;
* 80300007, all tokens invalid → PERMANENT ``bad_token`` (the device is removed);
* 80200003 OAuth token expired, 80200001 OAuth authentication error (and a 401 without
  a code) → the access token renewed once and the call made again; refused again →
  TRANSIENT ``auth: …``;
* 80300002 no permission to send for the app (a wrong app id, Push Kit not enabled),
  80300011 no permission for high urgency → TRANSIENT ``config: …``, ``fault="config"``
  (our configuration, not the device: kept);
* 80300008 message body too large (4 KB), 80100001 / 80100003 bad parameters or
  structure, 80300010 token count, any other 80xxxxxx or 4xx → PERMANENT ``invalid_request``;
  80100016 sensitive content → PERMANENT ``rejected``;
* 81000001 internal error, 5xx, 408 → TRANSIENT; HTTP 503 (Huawei: "traffic control")
  → TRANSIENT with ``retry_after`` from Retry-After; HTTP 429 → RATE_LIMITED, ``retry_after``
  from Retry-After.

Huawei documents the HTTP statuses (400 parameter error: see the code; 401 authentication;
500/502; 503 traffic control) and the codes apart, not which status goes with which code: the
body's ``code`` decides, the HTTP status only when there is none. (The simulator answers 400
for refused tokens and bodies, 401 for our access token, 200 for a partial success.)

Push Kit has neither an idempotency key nor a status query: ``data.notify_id`` carries
our delivery_id for the app to drop duplicates (and ``bi_tag`` the same, for the
receipts), and :meth:`query` answers ``supported=False``. Receipts (回执) go to an HTTPS
URL configured in AppGallery Connect as ``{"statuses": [{"biTag", "appid", "token",
"status", "timestamp", "requestId"}]}``: :func:`adapters.receipts.parse_hms_receipts`
matches them by ``requestId``, our ``provider_msg_id`` (one token per request: one
delivery per requestId; ``biTag`` carries the delivery id too). The URL is
``POST /v1/receipts/<provider name>``; the receipt configuration's callback user name
and key (``receipt_username``, ``receipt_key_env``) authenticate its
``X-HUAWEI-CALLBACK-ID`` header (:meth:`adapters.receipts.ReceiptVerifier.hms`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

import httpx
import orjson

from pipeline.models import AttemptResult, Delivery, Priority

from ._http import response_json
from ._token import OAuthProvider
from .apns import split_push_address, wrong_platform
from .base import Fault, PermanentKind, SendResult, Stopwatch, parse_retry_after

__all__ = ["HmsConfig", "HmsProvider", "hms_outcome", "illegal_tokens", "SUCCESS", "TOKEN_URL", "PUSH_URL"]

TOKEN_URL = "https://oauth-login.cloud.huawei.com/oauth2/v3/token"
PUSH_URL = "https://push-api.cloud.huawei.com"

SUCCESS = "80000000"
PARTIAL = "80100000"  #: some tokens failed: ``msg`` names them
INVALID_TOKENS = "80300007"  #: every token of the request is invalid
#: our OAuth access token: expired (80200003) or refused (80200001): renew once, call again
AUTH_CODES = frozenset({"80200001", "80200003"})
#: no permission for this app (80300002: wrong app id, Push Kit not enabled) or for
#: high urgency (80300011): our configuration, never the device
CONFIG_CODES = frozenset({"80300002", "80300011"})
SENSITIVE = "80100016"


@dataclass
class HmsConfig:
    client_id: str  #: the app's OAuth 2.0 client ID (AppGallery Connect)
    client_secret: str
    app_id: Optional[str] = None  #: the ``<appId>`` of the send URL; default: ``client_id``
    token_url: str = TOKEN_URL
    base_url: str = PUSH_URL
    timeout: float = 10.0
    connect_timeout: float = 5.0
    token_refresh_margin: float = 300.0  #: renew this long before expires_in runs out
    ttl_s: int = 24 * 3600  #: android.ttl
    verify: Any = True
    max_connections: int = 50
    name: str = "hms"
    #: the callback user name of the app's receipt configuration: not used to send; the
    #: API checks Push Kit's receipt callbacks with it and the callback key
    #: (``receipt_key_env`` / ``_file``, :func:`adapters.receipts.hms_receipt_config`)
    receipt_username: Optional[str] = None

    @property
    def send_path(self) -> str:
        return f"/v1/{self.app_id or self.client_id}/messages:send"


def illegal_tokens(msg: Any) -> list[str]:
    """The tokens an 80100000 / 80300007 answer names in its ``msg`` (JSON text:
    ``{"success", "failure", "illegal_tokens": [...]}``, or ``"illegalTokens"`` as a
    list or as lists by reason)."""
    if isinstance(msg, str):
        try:
            msg = orjson.loads(msg)
        except orjson.JSONDecodeError:
            return []
    if not isinstance(msg, Mapping):
        return []
    found = msg.get("illegal_tokens", msg.get("illegalTokens"))
    out: list[str] = []
    for v in (found.values() if isinstance(found, Mapping) else [found]):
        if isinstance(v, list):
            out += [str(t) for t in v]
        elif isinstance(v, str):
            out.append(v)
    return out


def hms_outcome(status: int, body: Mapping[str, Any], token: str) -> tuple[str, Optional[str], Optional[str], str]:
    """What a messages:send answer means: ``(result, permanent_kind, fault, error prefix)``."""
    code = str(body.get("code") or "")
    if code == SUCCESS or (not code and 200 <= status < 300):
        return AttemptResult.ACCEPTED, None, None, ""
    if code == PARTIAL:
        if token in illegal_tokens(body.get("msg")):
            return AttemptResult.PERMANENT_ERROR, PermanentKind.BAD_TOKEN, None, ""
        return AttemptResult.ACCEPTED, None, None, ""
    if code == INVALID_TOKENS:
        return AttemptResult.PERMANENT_ERROR, PermanentKind.BAD_TOKEN, None, ""
    if code in CONFIG_CODES:
        return AttemptResult.TRANSIENT_ERROR, None, Fault.CONFIG, "config: "
    if code in AUTH_CODES:
        return AttemptResult.TRANSIENT_ERROR, None, None, "auth: "
    if code == SENSITIVE:
        return AttemptResult.PERMANENT_ERROR, PermanentKind.REJECTED, None, ""
    if code.startswith("81"):
        return AttemptResult.TRANSIENT_ERROR, None, None, ""
    if status == 429:
        return AttemptResult.RATE_LIMITED, None, None, ""
    if status >= 500 or status == 408:
        return AttemptResult.TRANSIENT_ERROR, None, None, ""
    if status in (401, 403):
        return AttemptResult.TRANSIENT_ERROR, None, None, "auth: "
    # 80100xxx parameters, 80300008 too large, 80300010 token count, ...; any other 4xx
    return AttemptResult.PERMANENT_ERROR, PermanentKind.INVALID_REQUEST, None, ""


def _token_refused(resp: httpx.Response) -> bool:
    """An answer about our access token (80200003 expired, 80200001 refused, a 401 without a code)."""
    code = str(response_json(resp).get("code") or "")
    return code in AUTH_CODES or (resp.status_code == 401 and not code)


class HmsProvider(OAuthProvider):
    channel = "push"
    config: HmsConfig
    #: the device platform whose tokens this provider takes ("hms:<token>"), whatever its name
    platform = "hms"

    # ------------------------------------------------------------ OAuth

    async def _fetch_token(self) -> tuple[str, float]:
        resp = await self._client.post(
            self.config.token_url,
            data={"grant_type": "client_credentials", "client_id": self.config.client_id,
                  "client_secret": self.config.client_secret},
            headers={"accept": "application/json"},
        )
        body = response_json(resp)
        if resp.status_code != 200 or not body.get("access_token"):
            why = body.get("error_description") or body.get("error") or resp.text[:100]
            raise RuntimeError(f"oauth token: {resp.status_code} {why}")
        try:
            lifetime = float(body.get("expires_in", 3600))
        except (TypeError, ValueError):
            lifetime = 3600.0
        return str(body["access_token"]), lifetime

    # ------------------------------------------------------------ send

    def build_message(self, delivery: Delivery, *, validate_only: bool = False) -> dict[str, Any]:
        _, token = split_push_address(delivery.address)
        content = delivery.content or {}
        data: dict[str, Any] = {"notify_id": delivery.delivery_id}
        extra = content.get("data")
        if isinstance(extra, dict):
            data.update({str(k): v for k, v in extra.items()})
        android: dict[str, Any] = {
            "urgency": "HIGH" if delivery.priority == Priority.HIGH else "NORMAL",
            "ttl": f"{int(self.config.ttl_s)}s",
            "bi_tag": delivery.delivery_id,
        }
        if content.get("title") or content.get("body"):
            android["notification"] = {"title": str(content.get("title") or ""), "body": str(content.get("body") or ""),
                                       "click_action": {"type": 3}}
        message = {
            "token": [token],
            # one string (JSON text), not a map as in FCM
            "data": orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS, default=str).decode(),
            "android": android,
        }
        return {"validate_only": validate_only, "message": message}

    async def send(self, delivery: Delivery) -> SendResult:
        sw = Stopwatch()
        platform, token = split_push_address(delivery.address)
        if platform not in (None, "hms"):
            return wrong_platform(self.name, "hms", platform, sw.ms)
        if not token:
            return SendResult(AttemptResult.PERMANENT_ERROR, self.name, error="no HMS token",
                              permanent_kind=PermanentKind.BAD_TOKEN, latency_ms=sw.ms)
        return await self.post(self.build_message(delivery), token, sw)

    async def post(self, body: dict[str, Any], token: str, sw: Optional[Stopwatch] = None) -> SendResult:
        """POST one messages:send request; on an answer about our access token
        (80200003 expired, 80200001 refused, a 401 without a code) the token is renewed
        once and the request made again."""
        sw = sw or Stopwatch()
        content = orjson.dumps(body)
        answer = await self.post_with_token(
            sw,
            lambda bearer: self._client.post(self.config.send_path, content=content, headers={
                "authorization": f"Bearer {bearer}", "content-type": "application/json; charset=UTF-8"}),
            _token_refused,
        )
        if isinstance(answer, SendResult):
            return answer
        return self._map(answer, response_json(answer), token, sw.ms)

    def _map(self, resp: httpx.Response, body: dict[str, Any], token: str, latency_ms: float) -> SendResult:
        status = resp.status_code
        result, kind, fault, prefix = hms_outcome(status, body, token)
        request_id = body.get("requestId")
        if result == AttemptResult.ACCEPTED:
            return SendResult(result, self.name, provider_msg_id=str(request_id) if request_id else None,
                              latency_ms=latency_ms)
        code = str(body.get("code") or "")
        msg = str(body.get("msg") or resp.reason_phrase or "")
        error = f"{prefix}{status} {code}: {msg}".replace(" : ", ": ")[:300]
        retry_after = parse_retry_after(resp.headers.get("retry-after"))
        if result == AttemptResult.PERMANENT_ERROR:
            return SendResult(result, self.name, error=error, permanent_kind=kind, latency_ms=latency_ms)
        return SendResult(result, self.name, error=error, retry_after=retry_after, fault=fault, latency_ms=latency_ms)
