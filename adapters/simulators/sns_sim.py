"""Amazon SNS simulator (SMS by ``Publish`` to a phone number), aiohttp.

* ``POST /`` form-encoded (the SNS query API, ``Version=2010-03-31``), signed with
  AWS Signature Version 4 for service ``sns`` in ``region`` (403
  ``InvalidClientTokenId`` / ``SignatureDoesNotMatch`` / ``RequestExpired``
  otherwise, as query-protocol XML):

  * ``Action=Publish&PhoneNumber=<E.164>&Message=…`` (the SMS attributes as
    ``MessageAttributes.entry.N``; ``AWS.SNS.SMS.SMSType`` must be Promotional or
    Transactional) → 200 ``<PublishResponse><PublishResult><MessageId>``;
    a number not in E.164 → 400 ``InvalidParameter`` "Invalid parameter: PhoneNumber
    Reason: … is not valid to publish to";
  * ``Action=GetSMSAttributes`` → the account's SMS attributes (the credentials
    check: ledger op ``auth``, nothing sent).

* 429 ``Throttling`` "Rate exceeded" (no Retry-After); 5xx ``InternalError`` /
  ``ServiceUnavailable``.
* Scenarios by the last four digits of the number (as the Twilio simulator):
  0001 invalid (400 InvalidParameter), 0002 429 on the first call, 0003 slow,
  0004 accepted then no answer (UNKNOWN), 0006 503 on the first call, 0007 always
  500, 0008 opted out (400 InvalidParameter "… opted out"). SNS sends no delivery
  receipt over HTTP (delivery status goes to CloudWatch Logs), so neither does this.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
import uuid
from typing import Any, Optional
from urllib.parse import parse_qsl

from aiohttp import web

from .aws_sim import check_sigv4, new_access_key, xml_error
from .common import HttpSim, SimProfile, phone_scenario, text_scenario

__all__ = ["SnsSim"]

_E164 = re.compile(r"^\+[1-9][0-9]{6,14}$")
NS = "http://sns.amazonaws.com/doc/2010-03-31/"


def _attrs(form: dict[str, str]) -> dict[str, str]:
    out = {}
    for k, v in form.items():
        m = re.match(r"^MessageAttributes\.entry\.(\d+)\.Name$", k)
        if m:
            out[v] = form.get(f"MessageAttributes.entry.{m.group(1)}.Value.StringValue", "")
    return out


class SnsSim(HttpSim):
    name = "sns"

    def __init__(self, profile: Optional[SimProfile] = None, *, region: str = "us-east-1",
                 access_key: Optional[tuple[str, str]] = None, **kw: Any) -> None:
        super().__init__(profile, **kw)
        self.region = region
        self.access_key_id, self.secret_access_key = access_key or new_access_key()
        self.keys = {self.access_key_id: self.secret_access_key}

    def credentials(self) -> dict[str, Any]:
        return {"region": self.region, "access_key_id": self.access_key_id,
                "secret_access_key": self.secret_access_key}

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/", self._action)

    async def _action(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            form = dict(parse_qsl(raw.decode(), keep_blank_values=True))
        except UnicodeDecodeError:
            form = {}
        action = form.get("Action", "")
        problem = check_sigv4(request, raw, self.keys, self.region, "sns")
        if action == "GetSMSAttributes":
            self.core.record(op="auth", method="POST", path=request.path, key="", status=403 if problem else 200,
                             accepted=False)
            if problem is not None:
                return xml_error(403, problem[0], problem[1])
            return web.Response(content_type="text/xml", text=(
                f'<GetSMSAttributesResponse xmlns="{NS}"><GetSMSAttributesResult><attributes>'
                "<entry><key>DefaultSMSType</key><value>Transactional</value></entry>"
                "<entry><key>MonthlySpendLimit</key><value>100</value></entry>"
                f"</attributes></GetSMSAttributesResult><ResponseMetadata><RequestId>{uuid.uuid4()}</RequestId>"
                "</ResponseMetadata></GetSMSAttributesResponse>"))
        if action != "Publish":
            if problem is not None:
                return xml_error(403, problem[0], problem[1])
            return xml_error(400, "InvalidAction", f"The action {action[:40]} is not valid for this endpoint.")
        return await self._publish(request, form, problem)

    async def _publish(self, request: web.Request, form: dict[str, str],
                       problem: Optional[tuple[str, str]]) -> web.StreamResponse:
        core = self.core
        number = form.get("PhoneNumber", "")
        text = form.get("Message", "")
        # SNS takes no idempotency key: a message is its number and text (a resend is the same)
        key = hashlib.sha256(f"{number}\n{text}".encode()).hexdigest()[:24]
        entry: dict[str, Any] = {"op": "send", "method": "POST", "path": request.path, "key": key, "to": number}
        if problem is not None:
            core.record(**entry, status=403, outcome="unauthorized", accepted=False)
            return xml_error(403, problem[0], problem[1])
        if form.get("Version") != "2010-03-31":
            core.record(**entry, status=400, outcome="invalid_request", accepted=False)
            return xml_error(400, "InvalidParameter", "Invalid parameter: Version")
        if not text:
            core.record(**entry, status=400, outcome="invalid_request", accepted=False)
            return xml_error(400, "InvalidParameter", "Invalid parameter: Empty message")
        attrs = _attrs(form)
        if attrs.get("AWS.SNS.SMS.SMSType", "Transactional") not in ("Transactional", "Promotional"):
            core.record(**entry, status=400, outcome="invalid_request", accepted=False)
            return xml_error(400, "InvalidParameter", "Invalid parameter: MessageAttributes AWS.SNS.SMS.SMSType")
        scenario = text_scenario(text) or phone_scenario(number)
        if not _E164.match(number) or scenario == "invalid":
            core.record(**entry, status=400, outcome="invalid_number", accepted=False)
            return xml_error(400, "InvalidParameter", f"Invalid parameter: PhoneNumber Reason: {number[:20]} is not "
                             "valid to publish to")
        d = core.decide(key, scenario)
        if d.delay:
            await asyncio.sleep(d.delay)
        if d.action == "error":
            code = "ServiceUnavailable" if d.status == 503 else "InternalError"
            core.record(**entry, status=d.status, outcome="unavailable", cause=d.cause, accepted=False)
            return xml_error(d.status, code, "Service is unavailable" if d.status == 503 else "Internal Error",
                             sender=False)
        if d.action == "ratelimit":
            core.record(**entry, status=429, outcome="rate_limited", cause=d.cause, accepted=False)
            return xml_error(429, "Throttling", "Rate exceeded")
        if d.action == "permanent":
            what = "opted out" if d.scenario == "opted_out" else "invalid"
            core.record(**entry, status=400, outcome=what, cause=d.cause, accepted=False)
            return xml_error(400, "InvalidParameter", "Invalid parameter: PhoneNumber Reason: the number is opted out"
                             if d.scenario == "opted_out" else "Invalid parameter: PhoneNumber")
        mid = str(uuid.uuid4())
        core.messages[mid] = {"message_id": mid, "key": key, "to": number, "body": text, "attributes": attrs,
                              "form": form, "status": "accepted", "created": time.time()}
        await self.accepted(entry, d, mid)
        return web.Response(content_type="text/xml", text=(
            f'<PublishResponse xmlns="{NS}"><PublishResult><MessageId>{mid}</MessageId></PublishResult>'
            f"<ResponseMetadata><RequestId>{uuid.uuid4()}</RequestId></ResponseMetadata></PublishResponse>"))

    def by_number(self, number: str) -> list[dict[str, Any]]:
        return [m for m in self.core.messages.values() if m["to"] == number]
