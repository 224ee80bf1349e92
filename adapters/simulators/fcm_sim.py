"""FCM HTTP v1 simulator, with its own OAuth token endpoint, aiohttp.

* ``POST /token``: Google's service-account JWT bearer grant. The RS256
  assertion is verified with the generated service account's public key
  (``kid`` = private_key_id, ``iss`` = client_email, ``aud`` = this token URL,
  ``scope`` ∋ firebase.messaging, ``exp - iat`` ≤ 3600, not expired) →
  ``{"access_token", "expires_in", "token_type": "Bearer"}``; otherwise 400
  ``invalid_grant``.
* ``POST /v1/projects/{project_id}/messages:send`` with ``Authorization:
  Bearer <access token>`` (401 UNAUTHENTICATED otherwise) → ``{"name":
  "projects/{id}/messages/{n}"}``; errors in Google's format with an
  ``FcmError`` detail.
* As FCM: ``data`` values must be strings (400 INVALID_ARGUMENT "Invalid
  value at 'message.data[0].value' (TYPE_STRING)" otherwise); a token of an
  app whose APNs credential the project lacks answers 401 UNAUTHENTICATED with
  errorCode THIRD_PARTY_AUTH_ERROR (token prefix ``tpauth…``, or every token
  while ``third_party_auth_broken`` is set), whatever our access token.
* ``"validate_only": true`` (as FCM: the request is checked, nothing is
  delivered; ledger op ``validate``) → 200 ``…/messages/fake_message_id``, or
  400 INVALID_ARGUMENT for a token no device holds (``bad…``, ``gone…``,
  ``notify-auth-probe``): what ``notify providers check`` asks.
* Token-prefix scenarios: ``bad…`` → 400 INVALID_ARGUMENT (registration
  token), ``gone…`` → 404 UNREGISTERED, ``throttle…`` → 429 QUOTA_EXCEEDED
  with Retry-After on the first call, ``flaky…`` → 503 UNAVAILABLE on the
  first call, ``error…`` → 500 INTERNAL, ``slow…``, ``hang…`` (accepted, then
  no answer), ``tpauth…`` → 401 THIRD_PARTY_AUTH_ERROR.

FCM has no delivery receipts, so nothing is posted back.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import secrets
import time
from typing import Any, Optional

import jwt
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from ..fcm import FCM_SCOPE, JWT_BEARER_GRANT
from .common import HttpSim, SimProfile, text_scenario, token_scenario

__all__ = ["FcmSim"]

_FCM_ERROR = "type.googleapis.com/google.firebase.fcm.v1.FcmError"


def _gerr(http: int, status: str, message: str, code: Optional[str] = None, headers: Optional[dict[str, str]] = None) -> web.Response:
    err: dict[str, Any] = {"code": http, "message": message, "status": status}
    if code:
        err["details"] = [{"@type": _FCM_ERROR, "errorCode": code}]
    return web.json_response({"error": err}, status=http, headers=headers)


class FcmSim(HttpSim):
    name = "fcm"

    def __init__(self, profile: Optional[SimProfile] = None, *, project_id: str = "notify-sim", token_lifetime: int = 3600, **kw: Any) -> None:
        super().__init__(profile, **kw)
        self.project_id = project_id
        self.token_lifetime = token_lifetime
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.private_key_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode()
        self._public_key = key.public_key()
        self.private_key_id = secrets.token_hex(20)
        self.client_email = f"notify-sender@{project_id}.iam.gserviceaccount.com"
        self._tokens: dict[str, float] = {}  # access token → expiry
        self._ids = itertools.count(int(time.time() * 1000))
        self.token_grants = 0
        #: every send answers 401 THIRD_PARTY_AUTH_ERROR (the project's APNs key is missing)
        self.third_party_auth_broken = False

    @property
    def token_uri(self) -> str:
        return f"{self.base_url}/token"

    def service_account(self) -> dict[str, Any]:
        """What Google's console would download, pointing at this simulator."""
        return {
            "type": "service_account",
            "project_id": self.project_id,
            "private_key_id": self.private_key_id,
            "private_key": self.private_key_pem,
            "client_email": self.client_email,
            "token_uri": self.token_uri,
        }

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/token", self._token)
        app.router.add_post("/v1/projects/{project}/messages:send", self._send)

    def expire_tokens(self) -> None:
        """Make every issued access token invalid (tests of the 401 → renew path)."""
        self._tokens.clear()

    # ------------------------------------------------------------------ OAuth

    async def _token(self, request: web.Request) -> web.Response:
        form = await request.post()
        self.core.record(op="oauth", method="POST", path=request.path, key="")

        def bad(desc: str) -> web.Response:
            return web.json_response({"error": "invalid_grant", "error_description": desc}, status=400)

        if form.get("grant_type") != JWT_BEARER_GRANT:
            return web.json_response({"error": "unsupported_grant_type"}, status=400)
        assertion = str(form.get("assertion", ""))
        try:
            header = jwt.get_unverified_header(assertion)
            claims = jwt.decode(
                assertion,
                self._public_key,
                algorithms=["RS256"],
                audience=self.token_uri,
                issuer=self.client_email,
                options={"require": ["iss", "aud", "iat", "exp", "scope"]},
                leeway=60,
            )
        except jwt.PyJWTError as exc:
            return bad(f"Invalid JWT: {exc}")
        if header.get("kid") not in (None, self.private_key_id):
            return bad("Invalid JWT Signature.")
        if FCM_SCOPE not in str(claims.get("scope", "")).split():
            return bad("Invalid OAuth scope or ID token audience provided.")
        if int(claims["exp"]) - int(claims["iat"]) > 3600:
            return bad("Invalid JWT: Token must be a short-lived token (60 minutes)")
        token = "ya29.sim-" + secrets.token_urlsafe(24)
        self._tokens[token] = time.time() + self.token_lifetime
        self.token_grants += 1
        return web.json_response({"access_token": token, "expires_in": self.token_lifetime - 1, "token_type": "Bearer"})

    # ------------------------------------------------------------------ send

    async def _send(self, request: web.Request) -> web.StreamResponse:
        core = self.core
        try:
            body = await request.json()
        except ValueError:
            body = None
        message = body.get("message") if isinstance(body, dict) else None
        message = message if isinstance(message, dict) else {}
        data = message.get("data") if isinstance(message.get("data"), dict) else {}
        token = str(message.get("token") or "")
        key = str(data.get("notify_id") or "")
        entry: dict[str, Any] = {"op": "send", "method": "POST", "path": request.path, "key": key, "to": token}
        auth = request.headers.get("Authorization", "")
        bearer = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
        if not bearer or self._tokens.get(bearer, 0) < time.time():
            core.record(**entry, status=401, outcome="UNAUTHENTICATED", accepted=False)
            return _gerr(401, "UNAUTHENTICATED", "Request had invalid authentication credentials. Expected OAuth 2 access token.")
        if request.match_info["project"] != self.project_id:
            core.record(**entry, status=403, outcome="PERMISSION_DENIED", accepted=False)
            return _gerr(403, "PERMISSION_DENIED", "Permission denied on project.", "SENDER_ID_MISMATCH")
        if not token or not isinstance(body, dict):
            core.record(**entry, status=400, outcome="INVALID_ARGUMENT", accepted=False)
            return _gerr(400, "INVALID_ARGUMENT", "Request contains an invalid argument.", "INVALID_ARGUMENT")
        if self.third_party_auth_broken or token.lower().startswith("tpauth"):
            core.record(**entry, status=401, outcome="THIRD_PARTY_AUTH_ERROR", accepted=False)
            return _gerr(401, "UNAUTHENTICATED", "Auth error from APNS or Web Push Service", "THIRD_PARTY_AUTH_ERROR")
        bad_value = next((i for i, v in enumerate(data.values()) if not isinstance(v, str)), None)
        if bad_value is not None or not isinstance(message.get("data", {}), dict):
            core.record(**entry, status=400, outcome="INVALID_ARGUMENT", cause="data", accepted=False)
            at = f"message.data[{bad_value}].value" if bad_value is not None else "message.data"
            return _gerr(400, "INVALID_ARGUMENT", f"Invalid value at '{at}' (TYPE_STRING)", "INVALID_ARGUMENT")
        android = message.get("android") or {}
        if android.get("priority", "NORMAL") not in ("NORMAL", "HIGH"):
            core.record(**entry, status=400, outcome="INVALID_ARGUMENT", accepted=False)
            return _gerr(400, "INVALID_ARGUMENT", "Invalid value at 'message.android.priority'", "INVALID_ARGUMENT")
        notification = message.get("notification") or {}
        if body.get("validate_only") is True:
            # as FCM: the request checked, nothing delivered; no device holds a made-up token
            entry["op"] = "validate"
            if token_scenario(token) in ("bad_token", "gone") or token.startswith("notify-auth-probe"):
                core.record(**entry, status=400, outcome="INVALID_ARGUMENT", accepted=False)
                return _gerr(400, "INVALID_ARGUMENT", "The registration token is not a valid FCM registration token",
                             "INVALID_ARGUMENT")
            core.record(**entry, status=200, outcome="validated", accepted=False)
            return web.json_response({"name": f"projects/{self.project_id}/messages/fake_message_id"})
        d = core.decide(key or token, token_scenario(token) or text_scenario(notification.get("body")))
        if d.delay:
            await asyncio.sleep(d.delay)
        if d.action == "error":
            core.record(**entry, status=d.status, outcome="error", cause=d.cause, accepted=False)
            if d.status == 503:
                return _gerr(503, "UNAVAILABLE", "The service is currently unavailable.", "UNAVAILABLE")
            return _gerr(500, "INTERNAL", "Internal error encountered.", "INTERNAL")
        if d.action == "ratelimit":
            ra = str(max(1, math.ceil(d.retry_after or 1)))
            core.record(**entry, status=429, outcome="QUOTA_EXCEEDED", cause=d.cause, accepted=False, retry_after=ra)
            return _gerr(429, "RESOURCE_EXHAUSTED", "Quota exceeded for quota metric 'Send requests'.", "QUOTA_EXCEEDED", {"Retry-After": ra})
        if d.action == "permanent":
            if d.scenario == "gone":
                core.record(**entry, status=404, outcome="UNREGISTERED", cause=d.cause, accepted=False)
                return _gerr(404, "NOT_FOUND", "Requested entity was not found.", "UNREGISTERED")
            core.record(**entry, status=400, outcome="INVALID_ARGUMENT", cause=d.cause, accepted=False)
            return _gerr(400, "INVALID_ARGUMENT", "The registration token is not a valid FCM registration token", "INVALID_ARGUMENT")
        name = f"projects/{self.project_id}/messages/0:{next(self._ids)}%{secrets.token_hex(8)}"
        core.messages[name] = {"name": name, "key": key, "token": token, "message": message, "at": time.time()}
        if key:
            core.by_key[key] = name
        await self.accepted(entry, d, name)
        return web.json_response({"name": name})
