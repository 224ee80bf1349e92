"""Twilio SendGrid simulator (e-mail), aiohttp.

* ``POST /v3/mail/send`` with ``Authorization: Bearer <api key>`` (401
  ``{"errors": [{"message", "field", "help"}]}`` otherwise), the v3 body checked
  as SendGrid checks it (personalizations with ``to`` addresses, ``from.email``,
  a subject, ``content`` with ``text/plain`` first and no empty value; 400 with
  ``errors[]`` naming the field); a From address outside ``verified_senders``
  (when set) is 403, as an unverified Sender Identity is → 202 Accepted, empty
  body, ``X-Message-Id``.
* ``GET /v3/scopes`` → ``{"scopes": [...]}`` of the key (``mail.send`` …), 401 on a
  wrong key: the credentials check (ledger op ``auth``); ``scopes`` without
  ``mail.send`` makes sends 403, as a restricted key's.
* 429 carries ``X-RateLimit-Limit``, ``X-RateLimit-Remaining: 0`` and
  ``X-RateLimit-Reset`` (the unix time the window resets), no Retry-After.
* Signed Event Webhook: ``processed``, then ``delivered`` (or ``bounce`` /
  ``dropped``) and, for a delivered mail, ``open``, POSTed as a JSON array to
  ``receipts_url`` after ``receipt_delay``, signed with ECDSA P-256 / SHA-256 over
  ``timestamp + body`` (``X-Twilio-Email-Event-Webhook-Signature``, base64 DER;
  ``X-Twilio-Email-Event-Webhook-Timestamp``); the verification key is
  :attr:`SendGridSim.public_key` (base64 DER, as SendGrid shows it).
* Scenarios by the recipient's local part prefix (as the SMTP simulator):
  ``invalid`` (400, field ``personalizations.0.to.0.email``), ``bounce``
  (accepted, then a ``bounce`` event), ``dropped`` (accepted, then ``dropped``),
  ``throttle`` (429 on the first call), ``flaky`` (503 on the first call),
  ``error`` (always 500), ``slow``, ``hang``; or a ``#sim=<scenario>`` marker in
  the text.
"""

from __future__ import annotations

import asyncio
import base64
import math
import secrets
import time
from typing import Any, Optional

import orjson
from aiohttp import web
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from ..receipts_email import SENDGRID_SIGNATURE_HEADER, SENDGRID_TIMESTAMP_HEADER
from .common import HttpSim, SimProfile, address_scenario, post_receipt, text_scenario

__all__ = ["SendGridSim", "sign_sendgrid_event"]

_PREFIXES = (("invalid", "invalid"), ("bounce", "undelivered"), ("dropped", "dropped"), ("throttle", "throttle"),
             ("flaky", "flaky"), ("error", "error"), ("slow", "slow"), ("hang", "hang"))


def _scenario(address: str) -> Optional[str]:
    return address_scenario(address, _PREFIXES)


def _errors(status: int, message: str, field: Optional[str] = None, headers: Optional[dict[str, str]] = None,
            help_: Optional[str] = None) -> web.Response:
    return web.json_response({"errors": [{"message": message, "field": field, "help": help_}]}, status=status,
                             headers=headers)


def sign_sendgrid_event(key: ec.EllipticCurvePrivateKey, timestamp: str, payload: bytes) -> str:
    """The ``X-Twilio-Email-Event-Webhook-Signature`` of ``payload`` at ``timestamp``."""
    return base64.b64encode(key.sign(timestamp.encode() + payload, ec.ECDSA(hashes.SHA256()))).decode()


class SendGridSim(HttpSim):
    name = "sendgrid"

    def __init__(self, profile: Optional[SimProfile] = None, *, api_key: Optional[str] = None,
                 verified_senders: tuple[str, ...] = (), scopes: tuple[str, ...] = ("mail.send", "user.profile.read"),
                 rate_limit: int = 600, **kw: Any) -> None:
        super().__init__(profile, **kw)
        self.api_key = api_key or "SG." + secrets.token_urlsafe(16) + "." + secrets.token_urlsafe(32)
        self.verified_senders = tuple(verified_senders)
        self.scopes = tuple(scopes)
        self.rate_limit = rate_limit
        self.signing_key = ec.generate_private_key(ec.SECP256R1())
        der = self.signing_key.public_key().public_bytes(serialization.Encoding.DER,
                                                          serialization.PublicFormat.SubjectPublicKeyInfo)
        #: the Event Webhook verification key, base64 DER as SendGrid shows it
        self.public_key = base64.b64encode(der).decode()

    def credentials(self) -> dict[str, Any]:
        return {"api_key": self.api_key, "event_webhook_public_key": self.public_key}

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v3/mail/send", self._send)
        app.router.add_get("/v3/scopes", self._scopes)

    def _authorized(self, request: web.Request) -> bool:
        auth = request.headers.get("Authorization", "")
        return auth.startswith("Bearer ") and secrets.compare_digest(auth[7:].strip(), self.api_key)

    async def _scopes(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            self.core.record(op="auth", method="GET", path=request.path, key="", status=401, accepted=False)
            return _errors(401, "The provided authorization grant is invalid, expired, or revoked")
        self.core.record(op="auth", method="GET", path=request.path, key="", status=200, accepted=False)
        return web.json_response({"scopes": list(self.scopes)})

    @staticmethod
    def _check(body: Any) -> Optional[tuple[str, Optional[str]]]:
        """(message, field) of the first problem SendGrid would report, or None."""
        if not isinstance(body, dict):
            return "Bad Request", None
        pers = body.get("personalizations")
        if not isinstance(pers, list) or not pers:
            return "The personalizations field is required and must have at least one personalization.", \
                "personalizations"
        for i, p in enumerate(pers):
            to = p.get("to") if isinstance(p, dict) else None
            if not isinstance(to, list) or not to:
                return "The to array is required for all personalization objects, and must have at least one " \
                    "email object with a valid email address.", f"personalizations.{i}.to"
            for j, t in enumerate(to):
                addr = t.get("email") if isinstance(t, dict) else None
                if not isinstance(addr, str) or "@" not in addr or _scenario(addr) == "invalid":
                    return "Does not contain a valid address.", f"personalizations.{i}.to.{j}.email"
        sender = body.get("from")
        if not isinstance(sender, dict) or not isinstance(sender.get("email"), str) or "@" not in sender["email"]:
            return "The from object must be provided for every email send. It is an object that requires the " \
                "email parameter, but may also contain a name parameter.", "from.email"
        if not isinstance(body.get("subject"), str) or not body["subject"]:
            return "The subject is required. You can get around this requirement if you use a template with a " \
                "subject defined or if every personalization has a subject defined.", "subject"
        content = body.get("content")
        if not isinstance(content, list) or not content:
            return "Unless a valid template_id is provided, the content parameter is required.", "content"
        for k, c in enumerate(content):
            if not isinstance(c, dict) or not isinstance(c.get("type"), str) or not isinstance(c.get("value"), str) \
                    or not c["value"]:
                return "The content value must be a string at least one character in length.", f"content.{k}.value"
        types = [c["type"] for c in content]
        if "text/plain" in types and types[0] != "text/plain":
            return "If present, text/plain must be first, followed by text/html, followed by any other content.", \
                "content.0.type"
        headers = body.get("headers")
        if headers is not None and (not isinstance(headers, dict) or
                                    not all(isinstance(v, str) for v in headers.values())):
            return "Invalid type. Expected: object, given: array.", "headers"
        return None

    async def _send(self, request: web.Request) -> web.StreamResponse:
        core = self.core
        _, body = await self.read_json(request)
        first = {}
        if isinstance(body, dict) and isinstance(body.get("personalizations"), list) and body["personalizations"] \
                and isinstance(body["personalizations"][0], dict):
            first = body["personalizations"][0]
        to = ""
        if isinstance(first.get("to"), list) and first["to"] and isinstance(first["to"][0], dict):
            to = str(first["to"][0].get("email") or "")
        key = ""
        for args in (body.get("custom_args") if isinstance(body, dict) else None, first.get("custom_args")):
            if isinstance(args, dict) and args.get("notify_id"):
                key = str(args["notify_id"])
        entry: dict[str, Any] = {"op": "send", "method": "POST", "path": request.path, "key": key, "to": to}
        if not self._authorized(request):
            core.record(**entry, status=401, outcome="unauthorized", accepted=False)
            return _errors(401, "The provided authorization grant is invalid, expired, or revoked")
        if "mail.send" not in self.scopes:
            core.record(**entry, status=403, outcome="forbidden", accepted=False)
            return _errors(403, "access forbidden")
        problem = self._check(body)
        if problem is not None:
            core.record(**entry, status=400, outcome="invalid_request", cause=problem[1], accepted=False)
            return _errors(400, problem[0], problem[1])
        assert isinstance(body, dict)
        sender = body["from"]["email"]
        if self.verified_senders and sender not in self.verified_senders:
            core.record(**entry, status=403, outcome="unverified_sender", accepted=False)
            return _errors(403, "The from address does not match a verified Sender Identity. Mail cannot be sent "
                                "until this error is resolved.", "from",
                           help_="https://sendgrid.com/docs/for-developers/sending-email/sender-identity/")
        text = " ".join(str(c.get("value")) for c in body["content"])
        d = core.decide(key or secrets.token_hex(8), text_scenario(text) or _scenario(to))
        if d.delay:
            await asyncio.sleep(d.delay)
        if d.action == "error":
            core.record(**entry, status=d.status, outcome="unavailable", cause=d.cause, accepted=False)
            return _errors(d.status, "Service Unavailable" if d.status == 503 else "Internal Server Error")
        if d.action == "ratelimit":
            reset = str(math.ceil(time.time() + max(1.0, d.retry_after or 1.0)))
            core.record(**entry, status=429, outcome="rate_limited", cause=d.cause, accepted=False, reset=reset)
            return _errors(429, "too many requests", headers={
                "X-RateLimit-Limit": str(self.rate_limit), "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": reset})
        if d.action == "permanent":
            core.record(**entry, status=400, outcome="invalid_request", cause=d.cause, accepted=False)
            return _errors(400, "Does not contain a valid address.", "personalizations.0.to.0.email")
        mid = secrets.token_urlsafe(16)[:22]
        core.messages[mid] = {"message_id": mid, "key": key, "to": to, "from": sender, "body": body,
                              "headers": dict(request.headers), "status": "processed", "created": time.time()}
        core.by_key[key] = mid
        outcome = "dropped" if d.scenario == "dropped" else ("bounce" if d.undelivered else "delivered")
        core.spawn(self._events(mid, outcome))
        await self.accepted(entry, d, mid, 202)
        return web.Response(status=202, headers={"X-Message-Id": mid})

    def event_body(self, mid: str, kinds: list[str]) -> bytes:
        msg = self.core.messages[mid]
        now = int(time.time())
        events = []
        for i, kind in enumerate(kinds):
            ev: dict[str, Any] = {"email": msg["to"], "timestamp": now, "event": kind,
                                  "sg_event_id": secrets.token_urlsafe(16),
                                  "sg_message_id": f"{mid}.filterdrecv-{secrets.token_hex(4)}-1-{i}",
                                  "smtp-id": f"<{mid}@ismtpd0001p1mdw1.sendgrid.net>",
                                  "notify_id": msg["key"]}
            if kind == "bounce":
                ev.update(type="bounce", status="5.1.1", reason="550 5.1.1 The email account that you tried to "
                          "reach does not exist.", bounce_classification="Invalid Address")
            elif kind == "dropped":
                ev.update(reason="Bounced Address")
            elif kind == "delivered":
                ev.update(response="250 2.0.0 OK", tls=1)
            events.append(ev)
        return orjson.dumps(events)

    def signed(self, body: bytes, timestamp: Optional[str] = None) -> dict[str, str]:
        ts = timestamp or str(int(time.time()))
        return {"Content-Type": "application/json", SENDGRID_TIMESTAMP_HEADER: ts,
                SENDGRID_SIGNATURE_HEADER: sign_sendgrid_event(self.signing_key, ts, body)}

    async def _events(self, mid: str, outcome: str) -> None:
        await asyncio.sleep(self.core.receipt_delay())
        msg = self.core.messages.get(mid)
        if msg is None:
            return
        msg["status"] = outcome
        kinds = ["processed", outcome]
        if outcome == "delivered":
            kinds.append("open")
        if not self.receipts_url or self.session is None:
            return
        body = self.event_body(mid, kinds)
        await post_receipt(self.session, self.core, self.receipts_url, body=body, headers=self.signed(body),
                           info={"msg_id": mid, "key": msg["key"], "status_sent": outcome})
