"""SMS through Amazon SNS: ``Publish`` to a phone number.

Wire protocol: the SNS query API, ``POST https://sns.<region>.amazonaws.com/``,
form-encoded ``Action=Publish&Version=2010-03-31&PhoneNumber=<E.164>&Message=…``
with the SMS attributes as ``MessageAttributes.entry.N`` (``AWS.SNS.SMS.SMSType``
Transactional / Promotional, ``AWS.SNS.SMS.SenderID``,
``AWS.MM.SMS.OriginationNumber``), signed with AWS Signature Version 4 (service
``sns``) by botocore's ``SigV4Auth`` (:mod:`adapters.aws_sigv4`).

Answers (XML):

* 200 ``<PublishResponse><PublishResult><MessageId>``: ACCEPTED,
  ``provider_msg_id`` = the MessageId;
* ``Throttling`` / ``ThrottledException`` (429 or 400): RATE_LIMITED;
* ``InvalidParameter`` / ``InvalidParameterValue``: PERMANENT_ERROR,
  ``opted_out`` when SNS says the number opted out, ``invalid_number`` when it
  names the phone number, else ``invalid_request``;
* 401/403 and the credential codes (``InvalidClientTokenId``,
  ``SignatureDoesNotMatch``, ``AuthorizationError``, …): TRANSIENT_ERROR with
  ``fault="config"`` (another SMS provider may take the message);
* 5xx (``InternalError``, ``ServiceUnavailable``): TRANSIENT_ERROR; transport
  errors as every HTTP adapter.

SNS takes no idempotency key and has no status query for SMS (delivery status
goes to CloudWatch Logs, not to an HTTP callback): :meth:`query` answers
``supported=False``, and no receipts come back: a delivery through SNS stays
ACCEPTED.

A send goes straight through the aiohttp session of the adapter's client
(:class:`adapters._http.Route`: signed per call for the URL as httpx sends it),
the same request as through ``httpx.AsyncClient``; ``sms_attributes()`` goes
through the client; a client given to the constructor is used as it is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional
from urllib.parse import urlencode

import httpx

from pipeline.models import Delivery

from ._http import Reply, Route, direct_client, timed_send
from .aws_sigv4 import AwsSigner, aws_error, aws_result
from .base import PermanentKind, Provider, SendResult

__all__ = ["SnsSmsConfig", "SnsSmsProvider", "publish_form"]

VERSION = "2010-03-31"
FORM_TYPE = "application/x-www-form-urlencoded; charset=utf-8"
_MSG_ID = re.compile(rb"<MessageId>\s*([^<\s]{1,256})\s*</MessageId>")
INVALID_CODES = frozenset({"InvalidParameter", "InvalidParameterValue", "ValidationError"})


@dataclass
class SnsSmsConfig:
    region: str
    access_key_id: str
    secret_access_key: str
    session_token: Optional[str] = None
    base_url: Optional[str] = None  #: default ``https://sns.<region>.amazonaws.com``
    #: ``AWS.SNS.SMS.SMSType``: Transactional (OTPs: highest reliability) or Promotional
    sms_type: str = "Transactional"
    sender_id: Optional[str] = None  #: ``AWS.SNS.SMS.SenderID`` (where the country allows one)
    origination_number: Optional[str] = None  #: ``AWS.MM.SMS.OriginationNumber``
    timeout: float = 10.0
    connect_timeout: float = 5.0
    verify: Any = True
    max_connections: int = 50
    name: str = "sns"

    @property
    def endpoint(self) -> str:
        return (self.base_url or f"https://sns.{self.region}.amazonaws.com").rstrip("/")


def publish_form(config: SnsSmsConfig, number: str, message: str) -> list[tuple[str, str]]:
    """The Publish request's form fields, in order."""
    form = [("Action", "Publish"), ("Version", VERSION), ("PhoneNumber", number), ("Message", message)]
    attrs = [("AWS.SNS.SMS.SMSType", config.sms_type), ("AWS.SNS.SMS.SenderID", config.sender_id),
             ("AWS.MM.SMS.OriginationNumber", config.origination_number)]
    n = 0
    for name, value in attrs:
        if value:
            n += 1
            form += [(f"MessageAttributes.entry.{n}.Name", name),
                     (f"MessageAttributes.entry.{n}.Value.DataType", "String"),
                     (f"MessageAttributes.entry.{n}.Value.StringValue", value)]
    return form


def _message_id(resp: Reply) -> Optional[str]:
    m = _MSG_ID.search(resp.content)
    return m.group(1).decode() if m else None


def _permanent_kind(code: Optional[str], message: str) -> str:
    low = message.lower()
    if code in INVALID_CODES and "opted out" in low:
        return PermanentKind.OPTED_OUT
    if code in INVALID_CODES and "phone" in low:
        return PermanentKind.INVALID_NUMBER
    return PermanentKind.INVALID_REQUEST


class SnsSmsProvider(Provider):
    channel = "sms"

    def __init__(self, config: SnsSmsConfig, *, client: Optional[httpx.AsyncClient] = None) -> None:
        self.config = config
        self.name = config.name
        #: sends, straight through the client's transport (None: through the client given)
        self._route: Optional[Route] = None
        if client is None:
            client, direct = direct_client(config, config.endpoint)
            if direct is not None:  # the URL as AwsSigner.request makes it
                self._route = direct.route("POST", str(client.base_url).rstrip("/") + "/")
        self._client = client
        self.signer = AwsSigner.for_config(config, "sns")

    def _request(self, form: list[tuple[str, str]]) -> httpx.Request:
        body = urlencode(form).encode()
        return self.signer.request(self._client, "POST", "/", body=body, headers={"content-type": FORM_TYPE})

    async def send(self, delivery: Delivery) -> SendResult:
        text = str((delivery.content or {}).get("body") or "")
        route = self._route
        if route is not None:
            return await timed_send(
                self.name, lambda: self._send(route, publish_form(self.config, delivery.address, text)), self._map)
        return await timed_send(self.name, lambda: self._client.send(
            self._request(publish_form(self.config, delivery.address, text))), self._map)

    async def _send(self, route: Route, form: list[tuple[str, str]]) -> Reply:
        body = urlencode(form).encode()
        signed = self.signer.sign("POST", route.url_text, body, {"content-type": FORM_TYPE})
        return await route.send(body, tuple(signed.items()))

    def _map(self, resp: Reply, latency_ms: float) -> SendResult:
        return aws_result(self.name, resp, latency_ms, message_id=_message_id, permanent_kind=_permanent_kind)

    async def sms_attributes(self) -> tuple[int, dict[str, str], Optional[str], str]:
        """``GetSMSAttributes``: ``(status, attributes, error code, message)``; the
        credentials check of ``notify providers check`` (nothing is sent)."""
        resp = await self._client.send(self._request([("Action", "GetSMSAttributes"), ("Version", VERSION)]))
        if resp.status_code == 200:
            attrs = dict(re.findall(r"<key>([^<]*)</key>\s*<value>([^<]*)</value>", resp.text))
            return 200, attrs, None, ""
        code, message = aws_error(resp)
        return resp.status_code, {}, code, message

    async def close(self) -> None:
        await self._client.aclose()
