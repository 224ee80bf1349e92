"""Firebase Cloud Messaging, HTTP v1 API.

Wire protocol: ``POST /v1/projects/<project_id>/messages:send`` with
``{"message": {"token", "notification": {"title", "body"}, "data": {...},
"android": {"priority": "HIGH"|"NORMAL"}}}`` and ``Authorization: Bearer
<OAuth 2.0 access token>``. The access token comes from Google's OAuth server
through the service-account JWT bearer grant (RFC 7523): an RS256 JWT signed
with the service account's private key (header ``kid`` = private_key_id;
claims ``iss`` = client_email, ``scope`` = firebase.messaging, ``aud`` =
token_uri, ``iat``, ``exp`` ≤ iat + 3600) POSTed form-encoded to ``token_uri``
as ``grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer&assertion=<jwt>``.
The token is cached until shortly before ``expires_in``; a 401 renews it once,
unless its error is THIRD_PARTY_AUTH_ERROR (or the older APNS_AUTH_ERROR):
that is the Firebase project's APNs / web-push credential, not our token, so
there is no renewal and no resend: TRANSIENT_ERROR ``config: …`` with
``fault="config"`` (the breaker counts it, the dispatcher reports it, the
device is kept).

``data`` values must be strings (firebase-admin refuses anything else): a
string is sent as it is, anything else as its JSON text (``True`` → ``"true"``,
``{"a": 1}`` → ``'{"a":1}'``, ``None`` → ``"null"``), see :func:`data_value`.

Errors are ``{"error": {"code", "message", "status", "details": [{"@type":
"type.googleapis.com/google.firebase.fcm.v1.FcmError", "errorCode": ...}]}}``:
UNREGISTERED (404), SENDER_ID_MISMATCH (403) and INVALID_ARGUMENT about the
registration token (400) → PERMANENT_ERROR ``bad_token``; QUOTA_EXCEEDED (429)
→ RATE_LIMITED; UNAVAILABLE (503) / INTERNAL (500) → TRANSIENT_ERROR.

FCM has neither idempotency key nor status query: ``data.notify_id`` carries
our delivery_id for the app to drop duplicates, and :meth:`query` answers
``supported=False``. A real deployment passes the service-account JSON to
:meth:`FcmConfig.from_service_account`.

Over HTTP/1.1 (``http2`` false, the default) a send goes straight through the
aiohttp session of the adapter's client (:class:`adapters._http.Route`), the same
request as through ``httpx.AsyncClient``; token fetches go through the client; a
client given to the constructor, or ``http2``, sends everything through the client.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping, Optional

import httpx
import jwt
import orjson

from pipeline.models import AttemptResult, Delivery, Priority

from ._http import Reply, Route, direct_client, json_body, response_json
from ._token import OAuthProvider, load_private_key
from .apns import split_push_address, wrong_platform
from .base import Fault, PermanentKind, SendResult, Stopwatch, parse_retry_after

__all__ = ["FcmConfig", "FcmProvider", "FCM_SCOPE", "JWT_BEARER_GRANT", "data_value", "fcm_error"]

FCM_SCOPE = "https://www.googleapis.com/auth/firebase.messaging"
JWT_BEARER_GRANT = "urn:ietf:params:oauth:grant-type:jwt-bearer"
BAD_TOKEN_CODES = frozenset({"UNREGISTERED", "SENDER_ID_MISMATCH"})
#: 401s about the Firebase project's third-party credentials (APNs key or
#: certificate, web push): a configuration fault, our OAuth token is fine
THIRD_PARTY_AUTH_CODES = frozenset({"THIRD_PARTY_AUTH_ERROR", "APNS_AUTH_ERROR"})


def data_value(value: Any) -> str:
    """An FCM ``data`` value: strings as they are, anything else as JSON text."""
    if isinstance(value, str):
        return value
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS, default=str).decode()


def fcm_error(body: Mapping[str, Any]) -> tuple[str, str]:
    """``(code, message)`` of a Google API error body: the FcmError
    ``errorCode`` when there is one, else the canonical ``status``."""
    err = body.get("error") if isinstance(body.get("error"), dict) else {}
    code = str(err.get("status") or "")
    for d in err.get("details") or ():
        if isinstance(d, dict) and d.get("errorCode"):
            code = str(d["errorCode"])
    return code, str(err.get("message") or "")


@dataclass
class FcmConfig:
    project_id: str
    client_email: str
    private_key: str | bytes  #: PEM (RSA) from the service-account JSON
    private_key_id: Optional[str] = None
    token_uri: str = "https://oauth2.googleapis.com/token"
    base_url: str = "https://fcm.googleapis.com"
    scope: str = FCM_SCOPE
    timeout: float = 10.0
    connect_timeout: float = 5.0
    token_lifetime: int = 3600
    token_refresh_margin: float = 300.0  #: renew this long before expires_in runs out
    ttl_s: int = 24 * 3600  #: android.ttl
    http2: bool = False
    verify: Any = True
    max_connections: int = 50
    name: str = "fcm"

    @classmethod
    def from_service_account(cls, info: Mapping[str, Any], **kw: Any) -> "FcmConfig":
        """From a Google service-account JSON (``type: service_account``)."""
        return cls(
            project_id=info["project_id"],
            client_email=info["client_email"],
            private_key=info["private_key"],
            private_key_id=info.get("private_key_id"),
            token_uri=info.get("token_uri", "https://oauth2.googleapis.com/token"),
            **kw,
        )


def signing_key(pem: str | bytes) -> Any:
    """The service account's RSA key, loaded once (``load_private_key``: the
    registry's check of the configured key loaded it already): loading it checks
    the key, about 50 ms of CPU, which PyJWT given the PEM text paid on every
    assertion, on the event loop, once per token renewal (hourly) and at the first
    push after a start. A key that does not load is kept as its text: the
    assertion then fails as it did (the registry refuses such a key before a
    worker starts: adapters/registry.py)."""
    try:
        return load_private_key(pem)
    except (ValueError, TypeError):
        return pem


def _send_path(config: FcmConfig) -> str:
    return f"/v1/projects/{config.project_id}/messages:send"


class FcmProvider(OAuthProvider):
    channel = "push"
    config: FcmConfig

    def __init__(self, config: FcmConfig, *, clock: Callable[[], float] = time.time,
                 client: Optional[httpx.AsyncClient] = None) -> None:
        #: sends, straight through the client's transport (None: through the client)
        route: Optional[Route] = None
        if client is None and not config.http2:
            client, direct = direct_client(config)
            if direct is not None:
                route = direct.route("POST", _send_path(config), headers={"content-type": "application/json"})
        super().__init__(config, clock=clock, client=client)
        self._route = route
        self._signing_key = signing_key(config.private_key)

    # ------------------------------------------------------------ OAuth

    def assertion(self) -> str:
        now = int(self._clock())
        claims = {
            "iss": self.config.client_email,
            "sub": self.config.client_email,
            "scope": self.config.scope,
            "aud": self.config.token_uri,
            "iat": now,
            "exp": now + self.config.token_lifetime,
        }
        headers = {"kid": self.config.private_key_id} if self.config.private_key_id else None
        return jwt.encode(claims, self._signing_key, algorithm="RS256", headers=headers)

    async def _fetch_token(self) -> tuple[str, float]:
        resp = await self._client.post(
            self.config.token_uri,
            data={"grant_type": JWT_BEARER_GRANT, "assertion": self.assertion()},
            headers={"accept": "application/json"},
        )
        body = response_json(resp)
        if resp.status_code != 200 or "access_token" not in body:
            raise RuntimeError(f"oauth token: {resp.status_code} {body.get('error') or resp.text[:100]}")
        return str(body["access_token"]), float(body.get("expires_in", 3600))

    # ------------------------------------------------------------ send

    def build_message(self, delivery: Delivery) -> dict[str, Any]:
        _, token = split_push_address(delivery.address)
        content = delivery.content or {}
        notification = {k: content[k] for k in ("title", "body") if content.get(k)}
        data = {"notify_id": delivery.delivery_id}
        extra = content.get("data")
        if isinstance(extra, dict):
            # FCM data values must be strings: non-strings go as their JSON text
            data.update({str(k): data_value(v) for k, v in extra.items()})
        message: dict[str, Any] = {
            "token": token,
            "data": data,
            "android": {
                "priority": "HIGH" if delivery.priority == Priority.HIGH else "NORMAL",
                "ttl": f"{int(self.config.ttl_s)}s",
            },
        }
        if notification:
            message["notification"] = notification
        return {"message": message}

    async def send(self, delivery: Delivery) -> SendResult:
        sw = Stopwatch()
        platform, token = split_push_address(delivery.address)
        if platform not in (None, "fcm"):
            return wrong_platform(self.name, "fcm", platform, sw.ms)
        if not token:
            return SendResult(
                AttemptResult.PERMANENT_ERROR,
                self.name,
                error=f"not an FCM address: {delivery.address[:40]!r}",
                permanent_kind=PermanentKind.BAD_TOKEN,
                latency_ms=sw.ms,
            )
        body = self.build_message(delivery)
        route = self._route
        if route is not None:
            def call(bearer: str) -> Awaitable[Reply]:
                return route.send(json_body(body), (("authorization", f"Bearer {bearer}"),))
        else:
            path = _send_path(self.config)

            def call(bearer: str) -> Awaitable[Reply]:
                return self._client.post(path, json=body, headers={"authorization": f"Bearer {bearer}"})
        answer = await self.post_with_token(
            sw,
            call,
            # a 401 about our token, not the project's third-party credentials
            lambda resp: resp.status_code == 401 and fcm_error(response_json(resp))[0] not in THIRD_PARTY_AUTH_CODES,
        )
        if isinstance(answer, SendResult):
            return answer
        return self._map(answer, sw.ms)

    def _map(self, resp: Reply, latency_ms: float) -> SendResult:
        status = resp.status_code
        body = response_json(resp)
        if status == 200:
            return SendResult(AttemptResult.ACCEPTED, self.name, provider_msg_id=body.get("name"), latency_ms=latency_ms)
        code, message = fcm_error(body)
        message = message or resp.reason_phrase
        error = f"{status} {code}: {message}"[:300]
        retry_after = parse_retry_after(resp.headers.get("retry-after"))
        if code in THIRD_PARTY_AUTH_CODES:
            return SendResult(AttemptResult.TRANSIENT_ERROR, self.name, error=f"config: {error}"[:300],
                              fault=Fault.CONFIG, retry_after=retry_after, latency_ms=latency_ms)
        if code in BAD_TOKEN_CODES or (code == "INVALID_ARGUMENT" and "token" in message.lower()):
            return SendResult(
                AttemptResult.PERMANENT_ERROR, self.name, error=error, permanent_kind=PermanentKind.BAD_TOKEN, latency_ms=latency_ms
            )
        if status == 429 or code == "QUOTA_EXCEEDED":
            return SendResult(AttemptResult.RATE_LIMITED, self.name, error=error, retry_after=retry_after, latency_ms=latency_ms)
        if status >= 500 or status in (401, 403, 408):
            if status in (401, 403):
                error = "auth: " + error
            return SendResult(AttemptResult.TRANSIENT_ERROR, self.name, error=error, retry_after=retry_after, latency_ms=latency_ms)
        return SendResult(
            AttemptResult.PERMANENT_ERROR,
            self.name,
            error=error,
            permanent_kind=PermanentKind.INVALID_REQUEST,
            latency_ms=latency_ms,
        )
