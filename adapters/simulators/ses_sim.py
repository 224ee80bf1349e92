"""Amazon SES v2 simulator (e-mail), with the SNS topic SES publishes its
notifications to, aiohttp.

* ``POST /v2/email/outbound-emails`` (SendEmail), signed with AWS Signature
  Version 4 for service ``ses`` in ``region`` by one of ``keys`` (403
  ``InvalidClientTokenId`` / ``SignatureDoesNotMatch`` / ``RequestExpired``
  otherwise, the type in ``x-amzn-ErrorType``) → 200 ``{"MessageId"}``. The body
  checked (``FromEmailAddress``, ``Destination.ToAddresses``,
  ``Content.Simple.Subject`` and a ``Text`` or ``Html`` body: 400
  ``BadRequestException``); a From identity outside ``verified_identities`` (when
  set) is 400 ``MessageRejected`` "Email address is not verified", as in the SES
  sandbox.
* ``GET /v2/email/account`` (GetAccount, signed): the account's sending quota and
  whether sending is enabled; the credentials check (ledger op ``auth``).
* 429 ``TooManyRequestsException`` "Maximum sending rate exceeded." (no
  Retry-After, as SES); 5xx ``InternalFailure`` / ``ServiceUnavailable``.
* Notifications, as SES publishes them to an SNS topic with an HTTPS
  subscription: on start (with a ``receipts_url``) a signed
  ``SubscriptionConfirmation`` whose ``SubscribeURL`` (``GET
  /?Action=ConfirmSubscription&TopicArn=…&Token=…``, served here) confirms it;
  once confirmed (or with ``require_confirmation=False``), a signed
  ``Notification`` per message after ``receipt_delay``, its ``Message`` the SES
  identity notification (``notificationType`` Delivery, Bounce or Complaint,
  ``mail.messageId``). Signed with the topic's RSA key
  (:class:`~adapters.simulators.aws_sim.SnsTopicSigner`, ``signature_version`` 1
  or 2), the certificate served at ``SigningCertURL`` = ``<base_url>/SimpleNotificationService-<hex>.pem``.
* Scenarios by the recipient's local part prefix: ``reject`` (400
  MessageRejected), ``bounce`` (accepted, then a Permanent bounce),
  ``complaint`` (delivered, then a complaint), ``throttle`` (429 on the first
  call), ``flaky`` (503 on the first call), ``error`` (always 500), ``slow``,
  ``hang``; or a ``#sim=<scenario>`` marker in the text.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import secrets
import time
from typing import Any, Optional

import orjson
from aiohttp import web

from .aws_sim import SnsTopicSigner, check_sigv4, json_error, new_access_key
from .common import HttpSim, SimProfile, address_scenario, post_receipt, text_scenario

__all__ = ["SesSim"]

_PREFIXES = (("reject", "reject"), ("bounce", "undelivered"), ("complaint", "complaint"), ("throttle", "throttle"),
             ("flaky", "flaky"), ("error", "error"), ("slow", "slow"), ("hang", "hang"))


def _scenario(address: str) -> Optional[str]:
    return address_scenario(address, _PREFIXES)


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class SesSim(HttpSim):
    name = "ses"

    def __init__(self, profile: Optional[SimProfile] = None, *, region: str = "us-east-1",
                 access_key: Optional[tuple[str, str]] = None, verified_identities: tuple[str, ...] = (),
                 signature_version: str = "1", require_confirmation: bool = True, notify_deliveries: bool = True,
                 sending_enabled: bool = True, **kw: Any) -> None:
        super().__init__(profile, **kw)
        self.region = region
        self.access_key_id, self.secret_access_key = access_key or new_access_key()
        self.keys = {self.access_key_id: self.secret_access_key}
        self.verified_identities = tuple(verified_identities)
        self.signer = SnsTopicSigner(region, signature_version=signature_version)
        self.require_confirmation = require_confirmation
        self.notify_deliveries = notify_deliveries
        self.sending_enabled = sending_enabled
        self.confirmed = False
        self._token = secrets.token_hex(32)

    @property
    def topic_arn(self) -> str:
        return self.signer.topic_arn

    def credentials(self) -> dict[str, Any]:
        return {"region": self.region, "access_key_id": self.access_key_id,
                "secret_access_key": self.secret_access_key, "sns_topic_arn": self.topic_arn}

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v2/email/outbound-emails", self._send)
        app.router.add_get("/v2/email/account", self._account)
        app.router.add_get(self.signer.cert_path, self._cert)
        app.router.add_get("/", self._sns_action)

    async def start(self) -> str:
        url = await super().start()
        if self.receipts_url:
            self.core.spawn(self.subscribe())
        return url

    # ------------------------------------------------------------------ SES

    def _auth(self, request: web.Request, body: bytes) -> Optional[web.Response]:
        problem = check_sigv4(request, body, self.keys, self.region, "ses")
        if problem is None:
            return None
        status = 403
        return json_error(status, problem[0], problem[1])

    async def _account(self, request: web.Request) -> web.Response:
        denied = self._auth(request, b"")
        self.core.record(op="auth", method="GET", path=request.path, key="", status=403 if denied else 200,
                         accepted=False)
        if denied is not None:
            return denied
        return web.json_response({
            "DedicatedIpAutoWarmupEnabled": False, "EnforcementStatus": "HEALTHY", "ProductionAccessEnabled": True,
            "SendQuota": {"Max24HourSend": 50000.0, "MaxSendRate": 14.0,
                          "SentLast24Hours": float(sum(1 for m in self.core.messages.values()))},
            "SendingEnabled": self.sending_enabled})

    @staticmethod
    def _check(body: Any) -> Optional[str]:
        if not isinstance(body, dict):
            return "Request body is not a JSON object"
        if not isinstance(body.get("FromEmailAddress"), str) or "@" not in body["FromEmailAddress"]:
            return "FromEmailAddress is required"
        dest = body.get("Destination")
        to = dest.get("ToAddresses") if isinstance(dest, dict) else None
        if not isinstance(to, list) or not to or not all(isinstance(a, str) and "@" in a for a in to):
            return "Missing final '@domain'" if isinstance(to, list) and to else "Destination is required"
        simple = (body.get("Content") or {}).get("Simple") if isinstance(body.get("Content"), dict) else None
        if not isinstance(simple, dict):
            return "Content is required"
        subject = simple.get("Subject")
        if not isinstance(subject, dict) or not isinstance(subject.get("Data"), str):
            return "Subject is required"
        b = simple.get("Body")
        if not isinstance(b, dict) or not any(isinstance(b.get(k), dict) and isinstance(b[k].get("Data"), str)
                                              for k in ("Text", "Html")):
            return "Body must contain Text or Html"
        for h in simple.get("Headers") or []:
            if not isinstance(h, dict) or not isinstance(h.get("Name"), str) or not isinstance(h.get("Value"), str):
                return "Headers must be a list of {Name, Value}"
        for t in body.get("EmailTags") or []:
            if not isinstance(t, dict) or not all(isinstance(t.get(k), str) and t[k] and
                                                  all(c.isalnum() or c in "_-.@" for c in t[k])
                                                  for k in ("Name", "Value")):
                return "Tag values may only contain ASCII letters, numbers, underscores, dashes, periods and @"
        return None

    async def _send(self, request: web.Request) -> web.StreamResponse:
        core = self.core
        raw, body = await self.read_json(request)
        tags = {t.get("Name"): t.get("Value") for t in (body or {}).get("EmailTags") or [] if isinstance(t, dict)} \
            if isinstance(body, dict) else {}
        key = str(tags.get("notify_id") or "")
        to_list = ((body or {}).get("Destination") or {}).get("ToAddresses") if isinstance(body, dict) else None
        to = str(to_list[0]) if isinstance(to_list, list) and to_list else ""
        entry: dict[str, Any] = {"op": "send", "method": "POST", "path": request.path, "key": key, "to": to}
        denied = self._auth(request, raw)
        if denied is not None:
            core.record(**entry, status=403, outcome="unauthorized", accepted=False)
            return denied
        problem = self._check(body)
        if problem is not None:
            core.record(**entry, status=400, outcome="invalid_request", cause=problem, accepted=False)
            return json_error(400, "BadRequestException", problem)
        assert isinstance(body, dict)
        sender = body["FromEmailAddress"].rsplit("<", 1)[-1].rstrip(">").strip()
        if self.verified_identities and sender not in self.verified_identities and \
                sender.split("@", 1)[1] not in self.verified_identities:
            core.record(**entry, status=400, outcome="unverified_identity", accepted=False)
            return json_error(400, "MessageRejected", f"Email address is not verified. The following identities "
                              f"failed the check in region {self.region.upper()}: {sender}")
        simple = body["Content"]["Simple"]
        text = " ".join(str(v.get("Data")) for v in simple["Body"].values() if isinstance(v, dict))
        d = core.decide(key or secrets.token_hex(8), text_scenario(text) or _scenario(to))
        if d.delay:
            await asyncio.sleep(d.delay)
        if d.action == "error":
            code = "ServiceUnavailable" if d.status == 503 else "InternalFailure"
            core.record(**entry, status=d.status, outcome="unavailable", cause=d.cause, accepted=False)
            return json_error(d.status, code, "Service is unavailable" if d.status == 503 else
                              "The request processing has failed because of an unknown error.")
        if d.action == "ratelimit":
            core.record(**entry, status=429, outcome="rate_limited", cause=d.cause, accepted=False)
            return json_error(429, "TooManyRequestsException", "Maximum sending rate exceeded.")
        if d.action == "permanent":
            core.record(**entry, status=400, outcome="rejected", cause=d.cause, accepted=False)
            return json_error(400, "MessageRejected", "Email address is on the account-level suppression list.")
        mid = f"{int(time.time() * 1000):016x}-{secrets.token_hex(4)}-{secrets.token_hex(2)}-{secrets.token_hex(2)}-" \
              f"{secrets.token_hex(2)}-{secrets.token_hex(6)}-000000"
        core.messages[mid] = {"message_id": mid, "key": key, "to": to, "from": body["FromEmailAddress"],
                              "body": body, "status": "sent", "created": time.time()}
        core.by_key[key] = mid
        outcome = "bounce" if d.undelivered else ("complaint" if d.scenario == "complaint" else "delivery")
        core.spawn(self._notify(mid, outcome))
        await self.accepted(entry, d, mid)
        return web.json_response({"MessageId": mid})

    # ------------------------------------------------------------------ SNS

    async def _cert(self, request: web.Request) -> web.Response:
        return web.Response(body=self.signer.cert_pem, content_type="application/x-x509-ca-cert")

    async def _sns_action(self, request: web.Request) -> web.Response:
        q = request.query
        if q.get("Action") == "ConfirmSubscription" and q.get("Token") == self._token \
                and q.get("TopicArn") == self.topic_arn:
            self.confirmed = True
            self.core.record(op="confirm", method="GET", path=request.path, key="", status=200, accepted=False)
            return web.Response(text=(
                '<ConfirmSubscriptionResponse xmlns="http://sns.amazonaws.com/doc/2010-03-31/"><ConfirmSubscriptionResult>'
                f"<SubscriptionArn>{self.topic_arn}:{secrets.token_hex(8)}</SubscriptionArn></ConfirmSubscriptionResult>"
                "</ConfirmSubscriptionResponse>"), content_type="text/xml")
        return web.Response(status=400, text="<ErrorResponse><Error><Code>InvalidParameter</Code></Error></ErrorResponse>",
                            content_type="text/xml")

    def subscription_confirmation(self) -> dict[str, Any]:
        message = (f"You have chosen to subscribe to the topic {self.topic_arn}.\n"
                   "To confirm the subscription, visit the SubscribeURL included in this message.")
        return self.signer.message(self.base_url, "SubscriptionConfirmation", message, token=self._token)

    async def subscribe(self) -> None:
        """POST the SubscriptionConfirmation to ``receipts_url`` (SNS does, once, when the
        subscription is created)."""
        if not self.receipts_url or self.session is None:
            return
        body = orjson.dumps(self.subscription_confirmation())
        await post_receipt(self.session, self.core, self.receipts_url, body=body, headers=self._sns_headers(
            "SubscriptionConfirmation"), info={"status_sent": "SubscriptionConfirmation"})

    def _sns_headers(self, kind: str, message_id: str = "") -> dict[str, str]:
        return {"Content-Type": "text/plain; charset=UTF-8", "x-amz-sns-message-type": kind,
                "x-amz-sns-message-id": message_id, "x-amz-sns-topic-arn": self.topic_arn,
                "User-Agent": "Amazon Simple Notification Service Agent"}

    def ses_event(self, mid: str, outcome: str) -> dict[str, Any]:
        """The SES identity notification of ``outcome`` (delivery | bounce | complaint)."""
        msg = self.core.messages[mid]
        now = time.time()
        mail = {"timestamp": _iso(msg["created"]), "messageId": mid, "source": msg["from"],
                "sourceArn": f"arn:aws:ses:{self.region}:123456789012:identity/{msg['from'].split('@')[-1]}",
                "destination": [msg["to"]], "headersTruncated": False}
        if outcome == "bounce":
            return {"notificationType": "Bounce", "mail": mail, "bounce": {
                "bounceType": "Permanent", "bounceSubType": "General", "timestamp": _iso(now),
                "feedbackId": f"{mid}-{secrets.token_hex(4)}",
                "bouncedRecipients": [{"emailAddress": msg["to"], "action": "failed", "status": "5.1.1",
                                       "diagnosticCode": "smtp; 550 5.1.1 user unknown"}]}}
        if outcome == "complaint":
            return {"notificationType": "Complaint", "mail": mail, "complaint": {
                "complainedRecipients": [{"emailAddress": msg["to"]}], "timestamp": _iso(now),
                "feedbackId": f"{mid}-{secrets.token_hex(4)}", "complaintFeedbackType": "abuse"}}
        return {"notificationType": "Delivery", "mail": mail, "delivery": {
            "timestamp": _iso(now), "processingTimeMillis": int((now - msg["created"]) * 1000),
            "recipients": [msg["to"]], "smtpResponse": "250 ok", "reportingMTA": "a8-70.smtp-out.amazonses.com"}}

    def notification(self, mid: str, outcome: str) -> dict[str, Any]:
        return self.signer.message(self.base_url, "Notification", orjson.dumps(self.ses_event(mid, outcome)).decode())

    async def _notify(self, mid: str, outcome: str) -> None:
        await asyncio.sleep(self.core.receipt_delay())
        msg = self.core.messages.get(mid)
        if msg is None:
            return
        msg["status"] = outcome
        if not self.receipts_url or self.session is None:
            return
        if self.require_confirmation and not self.confirmed:
            self.core.receipts.append({"t": time.time(), "msg_id": mid, "status": "not_subscribed"})
            return
        outcomes = ["delivery", "complaint"] if outcome == "complaint" else [outcome]
        for o in outcomes:
            if o == "delivery" and not self.notify_deliveries:
                continue
            note = self.notification(mid, o)
            await post_receipt(self.session, self.core, self.receipts_url, body=orjson.dumps(note),
                               headers=self._sns_headers("Notification", note["MessageId"]),
                               info={"msg_id": mid, "key": msg["key"], "status_sent": o})
