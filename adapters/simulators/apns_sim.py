"""APNs simulator: HTTP/2 speaking Apple's provider API closely enough for
:class:`adapters.apns.ApnsProvider`; cleartext with prior knowledge by
default, or TLS with ALPN ``h2`` and a self-signed certificate (``tls=True``),
as the real service.

* ``POST /3/device/<token>``; the provider JWT is verified with the public
  key of the generated ES256 key (``kid`` must match, ``iss`` = team id,
  ``iat`` not older than one hour → else 403 ``InvalidProviderToken`` /
  ``ExpiredProviderToken``); ``apns-topic`` must be the configured bundle id;
  ``apns-push-type``, ``apns-priority``, ``apns-id``, ``apns-expiration`` and
  ``apns-collapse-id`` are validated as APNs does; payload ≤ 4096 bytes.
* Token-prefix scenarios: ``bad…`` → 400 BadDeviceToken, ``gone…`` → 410
  Unregistered (with ``timestamp``: now), ``throttle…`` → 429 TooManyRequests
  on the first push *to that device*, ``nottopic…`` → 400
  DeviceTokenNotForTopic, ``flaky…`` → 503 on the first call, ``error…`` →
  500, ``slow…`` → slow, ``hang…`` → accepted and recorded, then no answer
  (TIMEOUT_UNKNOWN).
* As APNs: 429 TooManyRequests is per device token (``device_rate=(n, s)``:
  more than n pushes to one token within s seconds are refused); a token
  :meth:`ApnsSim.unregister` ed answers 410 Unregistered with the ``timestamp``
  (ms) it was unregistered at; a token :meth:`ApnsSim.register` ed for another
  topic answers 400 DeviceTokenNotForTopic; :meth:`ApnsSim.expire_provider_tokens`
  makes every JWT seen so far answer 403 ExpiredProviderToken; with
  ``token_min_renewal`` set, a new JWT sooner than that after the last one,
  while the last is still good, answers 429 TooManyProviderTokenUpdates.
  ``provider_tokens`` counts the JWTs taken.
* ``/_sim/mode``, ``/_sim/ledger``, ``/_sim/reset`` as every simulator.

APNs has no delivery receipts, so nothing is posted back.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import string
import time
import uuid
from collections import deque
from typing import Any, Optional

import jwt
import orjson
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from .common import SimCore, SimProfile, text_scenario, token_scenario
from .h2server import H2Request, H2Server
from .tls import server_tls_context

__all__ = ["ApnsSim"]

PUSH_TYPES = {"alert", "background", "voip", "complication", "fileprovider", "mdm", "location", "liveactivity", "pushtotalk", "widgets"}
_TOKEN_RE = re.compile(r"^[A-Za-z0-9_\-]{1,200}$")


def _rand_id(n: int = 10) -> str:
    alphabet = string.ascii_uppercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(n))


class ApnsSim:
    name = "apns"

    def __init__(
        self,
        profile: Optional[SimProfile] = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        topic: str = "com.example.notify",
        team_id: Optional[str] = None,
        key_id: Optional[str] = None,
        tls: bool = False,
        device_rate: Optional[tuple[int, float]] = None,
        token_min_renewal: Optional[float] = None,
    ) -> None:
        self.core = SimCore(self.name, profile or SimProfile.realistic())
        self.device_rate = device_rate
        self.token_min_renewal = token_min_renewal
        self._device_pushes: dict[str, deque[float]] = {}
        self._throttled_once: set[str] = set()
        self.unregistered: dict[str, int] = {}  #: token → ms since the epoch
        self.device_topics: dict[str, str] = {}  #: token → the topic it was issued for
        self._expired: set[str] = set()
        self._current_token: Optional[str] = None
        self._current_since = 0.0
        self.provider_tokens = 0  #: distinct provider JWTs taken
        self.topic = topic
        self.team_id = team_id or _rand_id()
        self.key_id = key_id or _rand_id()
        key = ec.generate_private_key(ec.SECP256R1())
        self.private_key_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode()
        self._public_key = key.public_key()
        self._verified: dict[str, int] = {}  # JWT → iat (APNs caches verified tokens too)
        self.cert_pem: Optional[bytes] = None  #: with tls=True: the certificate to trust
        ssl_context = None
        if tls:
            self.cert_pem, ssl_context = server_tls_context(host, "localhost")
        self.server = H2Server(self.handle, host, port, ssl_context=ssl_context)
        self.host = host

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def base_url(self) -> str:
        scheme = "https" if self.server.ssl_context is not None else "http"
        return f"{scheme}://{self.host}:{self.server.port}"

    def credentials(self) -> dict[str, Any]:
        return {"team_id": self.team_id, "key_id": self.key_id, "private_key": self.private_key_pem, "topic": self.topic}

    def unregister(self, token: str, at: Optional[float] = None) -> None:
        """From now on ``token`` answers 410 Unregistered with ``timestamp`` =
        ``at`` (unix seconds; default now), as when the app was removed."""
        self.unregistered[token] = int((time.time() if at is None else at) * 1000)

    def register(self, token: str, topic: Optional[str] = None) -> None:
        """``token`` was issued for ``topic`` (default: ours) and is valid again."""
        self.unregistered.pop(token, None)
        self.device_topics[token] = topic or self.topic

    def expire_provider_tokens(self) -> None:
        """Every provider JWT seen so far answers 403 ExpiredProviderToken from now on."""
        self._expired.update(self._verified)

    async def start(self) -> str:
        await self.server.start()
        return self.base_url

    async def stop(self) -> None:
        await self.core.close()
        await self.server.stop()

    # ------------------------------------------------------------------ http

    @staticmethod
    def _json(status: int, obj: Any, extra: Optional[list[tuple[str, str]]] = None) -> tuple[int, list[tuple[str, str]], bytes]:
        return status, [("content-type", "application/json")] + (extra or []), orjson.dumps(obj)

    async def handle(self, req: H2Request) -> tuple[int, list[tuple[str, str]], bytes]:
        path = req.path.split("?", 1)[0]
        if path == "/_sim/mode":
            if req.method == "POST":
                try:
                    return self._json(200, self.core.set_mode(orjson.loads(bytes(req.body) or b"{}")))
                except (ValueError, TypeError) as exc:
                    return self._json(400, {"error": str(exc)})
            return self._json(200, self.core.mode_info())
        if path == "/_sim/ledger":
            key = None
            if "?" in req.path:
                from urllib.parse import parse_qs

                key = (parse_qs(req.path.split("?", 1)[1]).get("key") or [None])[0]
            return self._json(200, {"sim": self.name, "calls": self.core.ledger_view(key), "receipts": []})
        if path == "/_sim/reset":
            self.core.reset()
            self._throttled_once.clear()
            self._device_pushes.clear()
            return self._json(200, {"ok": True})
        if path.startswith("/3/device/"):
            return await self._push(req, path[len("/3/device/"):])
        return self._json(404, {"reason": "BadPath"})

    def _check_auth(self, req: H2Request) -> Optional[str]:
        auth = req.headers.get("authorization", "")
        if not auth.lower().startswith("bearer "):
            return "MissingProviderToken"
        token = auth[7:].strip()
        now = time.time()
        if token in self._expired:
            return "ExpiredProviderToken"
        iat = self._verified.get(token)
        if iat is None:
            try:
                header = jwt.get_unverified_header(token)
                if header.get("alg") != "ES256" or header.get("kid") != self.key_id:
                    return "InvalidProviderToken"
                claims = jwt.decode(
                    token,
                    self._public_key,
                    algorithms=["ES256"],
                    options={"require": ["iss", "iat"], "verify_iat": False, "verify_exp": False},
                )
            except jwt.PyJWTError:
                return "InvalidProviderToken"
            if claims.get("iss") != self.team_id:
                return "InvalidProviderToken"
            iat = int(claims["iat"])
            if iat > now + 300:
                return "InvalidProviderToken"
            if iat < now - 3600:
                return "ExpiredProviderToken"
            current = self._current_token
            if (
                self.token_min_renewal is not None
                and current is not None
                and current not in self._expired
                and self._verified.get(current, 0) >= now - 3600
                and now - self._current_since < self.token_min_renewal
            ):
                return "TooManyProviderTokenUpdates"
            self._verified[token] = iat
            self._current_token, self._current_since = token, now
            self.provider_tokens += 1
        if iat < now - 3600:
            return "ExpiredProviderToken"
        return None

    def _validate(self, req: H2Request, device_token: str) -> Optional[tuple[int, str]]:
        h = req.headers
        if req.method != "POST":
            return 405, "MethodNotAllowed"
        if not _TOKEN_RE.match(device_token):
            return 400, "BadDeviceToken"
        topic = h.get("apns-topic")
        if not topic:
            return 400, "MissingTopic"
        if topic != self.topic:
            return 400, "TopicDisallowed"
        if h.get("apns-push-type", "alert") not in PUSH_TYPES:
            return 400, "InvalidPushType"
        if h.get("apns-priority", "10") not in ("5", "10", "1"):
            return 400, "BadPriority"
        if "apns-id" in h:
            try:
                uuid.UUID(h["apns-id"])
            except ValueError:
                return 400, "BadMessageId"
        if "apns-expiration" in h and not h["apns-expiration"].isdigit():
            return 400, "BadExpirationDate"
        if len(h.get("apns-collapse-id", "").encode()) > 64:
            return 400, "BadCollapseId"
        if not req.body:
            return 400, "PayloadEmpty"
        if len(req.body) > 4096:
            return 413, "PayloadTooLarge"
        return None

    def _device_answer(self, token: str, throttle: bool = False) -> Optional[tuple[int, str, dict[str, Any]]]:
        """What APNs answers for this device whatever the message: unregistered,
        issued for another topic, or throttled (too many pushes to it)."""
        if token in self.unregistered:
            return 410, "Unregistered", {"timestamp": self.unregistered[token]}
        topic = self.device_topics.get(token)
        if (topic is not None and topic != self.topic) or token.lower().startswith("nottopic"):
            return 400, "DeviceTokenNotForTopic", {}
        if throttle and token not in self._throttled_once:
            self._throttled_once.add(token)
            return 429, "TooManyRequests", {}
        if self.device_rate is not None:
            n, window = self.device_rate
            now = time.monotonic()
            pushes = self._device_pushes.setdefault(token, deque())
            while pushes and pushes[0] <= now - window:
                pushes.popleft()
            if len(pushes) >= n:
                return 429, "TooManyRequests", {}
            pushes.append(now)
        return None

    async def _push(self, req: H2Request, device_token: str) -> tuple[int, list[tuple[str, str]], bytes]:
        core = self.core
        apns_id = req.headers.get("apns-id") or str(uuid.uuid4())
        try:
            payload = orjson.loads(bytes(req.body)) if req.body else {}
        except orjson.JSONDecodeError:
            payload = None
        key = ""
        if isinstance(payload, dict):
            key = str(payload.get("notify_id") or "")
        key = key or req.headers.get("apns-collapse-id") or apns_id
        entry: dict[str, Any] = {"op": "send", "method": req.method, "path": req.path, "key": key, "to": device_token, "apns_id": apns_id}

        auth_error = self._check_auth(req)
        if auth_error:
            status = 429 if auth_error == "TooManyProviderTokenUpdates" else 403
            core.record(**entry, status=status, outcome=auth_error, accepted=False)
            return self._json(status, {"reason": auth_error}, [("apns-id", apns_id)])
        invalid = self._validate(req, device_token)
        if invalid is None and not (isinstance(payload, dict) and isinstance(payload.get("aps"), dict)):
            invalid = (400, "BadPayload") if payload is None else (400, "PayloadEmpty")
        if invalid:
            core.record(**entry, status=invalid[0], outcome=invalid[1], accepted=False)
            return self._json(invalid[0], {"reason": invalid[1]}, [("apns-id", apns_id)])

        hdr = [("apns-id", apns_id)]
        alert = payload["aps"].get("alert")
        text = alert.get("body") if isinstance(alert, dict) else alert
        scenario = token_scenario(device_token) or text_scenario(text)
        device = self._device_answer(device_token, throttle=scenario == "throttle")
        if device is not None:
            status, reason, extra = device
            core.record(**entry, status=status, outcome=reason, cause="device", accepted=False)
            return self._json(status, {"reason": reason, **extra}, hdr)
        if scenario == "throttle":
            scenario = None  # APNs throttles per device: answered above
        d = core.decide(key, scenario)
        if d.delay:
            await asyncio.sleep(d.delay)
        if d.action == "error":
            reason = "ServiceUnavailable" if d.status == 503 else "InternalServerError"
            core.record(**entry, status=d.status, outcome=reason, cause=d.cause, accepted=False)
            return self._json(d.status, {"reason": reason}, hdr)
        if d.action == "ratelimit":
            core.record(**entry, status=429, outcome="TooManyRequests", cause=d.cause, accepted=False)
            return self._json(429, {"reason": "TooManyRequests"}, hdr)
        if d.action == "permanent":
            if d.scenario == "gone":
                core.record(**entry, status=410, outcome="Unregistered", cause=d.cause, accepted=False)
                return self._json(410, {"reason": "Unregistered", "timestamp": int(time.time() * 1000)}, hdr)
            core.record(**entry, status=400, outcome="BadDeviceToken", cause=d.cause, accepted=False)
            return self._json(400, {"reason": "BadDeviceToken"}, hdr)
        unique = str(uuid.uuid4())
        core.messages[apns_id] = {"apns_id": apns_id, "token": device_token, "key": key, "payload": payload, "headers": dict(req.headers), "at": time.time()}
        core.by_key[key] = apns_id
        if d.action == "hang":
            core.record(**entry, status="hang", outcome="accepted_no_answer", cause=d.cause, accepted=True)
            await asyncio.sleep(core.profile.hang_s)
            return 200, hdr + [("apns-unique-id", unique)], b""
        core.record(**entry, status=200, outcome="accepted", cause=d.cause, accepted=True)
        return 200, hdr + [("apns-unique-id", unique)], b""
