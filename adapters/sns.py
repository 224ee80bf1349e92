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
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional
from urllib.parse import urlencode

import httpx

from pipeline.models import AttemptResult, Delivery

from ._http import exception_result, make_client
from .aws_sigv4 import AUTH_CODES, THROTTLE_CODES, AwsSigner, aws_error
from .base import Fault, PermanentKind, Provider, SendResult, Stopwatch, parse_retry_after

__all__ = ["SnsSmsConfig", "SnsSmsProvider", "publish_form"]

VERSION = "2010-03-31"
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


class SnsSmsProvider(Provider):
    channel = "sms"

    def __init__(self, config: SnsSmsConfig, *, client: Optional[httpx.AsyncClient] = None) -> None:
        self.config = config
        self.name = config.name
        self._client = client or make_client(
            config.endpoint,
            timeout=config.timeout,
            connect_timeout=config.connect_timeout,
            verify=config.verify,
            max_connections=config.max_connections,
        )
        self.signer = AwsSigner(config.access_key_id, config.secret_access_key, config.region, "sns",
                                config.session_token)

    def _request(self, form: list[tuple[str, str]]) -> httpx.Request:
        body = urlencode(form).encode()
        return self.signer.request(self._client, "POST", "/", body=body,
                                   headers={"content-type": "application/x-www-form-urlencoded; charset=utf-8"})

    async def send(self, delivery: Delivery) -> SendResult:
        sw = Stopwatch()
        text = str((delivery.content or {}).get("body") or "")
        try:
            resp = await self._client.send(self._request(publish_form(self.config, delivery.address, text)))
        except Exception as exc:  # noqa: BLE001
            return exception_result(self.name, exc, sw.ms)
        return self._map(resp, sw.ms)

    def _map(self, resp: httpx.Response, latency_ms: float) -> SendResult:
        status = resp.status_code
        name = self.name
        if status == 200:
            m = _MSG_ID.search(resp.content)
            if m:
                return SendResult(AttemptResult.ACCEPTED, name, provider_msg_id=m.group(1).decode(),
                                  latency_ms=latency_ms)
            return SendResult(AttemptResult.TIMEOUT_UNKNOWN, name, error=f"{status} without a MessageId",
                              latency_ms=latency_ms)
        code, message = aws_error(resp)
        error = f"{status} {code or ''} {message or resp.reason_phrase}".strip()[:300]
        retry_after = parse_retry_after(resp.headers.get("retry-after"))
        if status == 429 or code in THROTTLE_CODES:
            return SendResult(AttemptResult.RATE_LIMITED, name, error=error, retry_after=retry_after,
                              latency_ms=latency_ms)
        if status in (401, 403) or code in AUTH_CODES:
            return SendResult(AttemptResult.TRANSIENT_ERROR, name, error=f"auth: {error}"[:300], fault=Fault.CONFIG,
                              latency_ms=latency_ms)
        if status >= 500 or status == 408:
            return SendResult(AttemptResult.TRANSIENT_ERROR, name, error=error, retry_after=retry_after,
                              latency_ms=latency_ms)
        low = message.lower()
        if code in INVALID_CODES and "opted out" in low:
            kind = PermanentKind.OPTED_OUT
        elif code in INVALID_CODES and "phone" in low:
            kind = PermanentKind.INVALID_NUMBER
        else:
            kind = PermanentKind.INVALID_REQUEST
        return SendResult(AttemptResult.PERMANENT_ERROR, name, error=error, permanent_kind=kind, latency_ms=latency_ms)

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
