"""E-mail through Amazon SES: the SES v2 ``SendEmail`` API.

Wire protocol: ``POST https://email.<region>.amazonaws.com/v2/email/outbound-emails``,
JSON, signed with AWS Signature Version 4 (service ``ses``) by botocore's
``SigV4Auth`` (:mod:`adapters.aws_sigv4`). The body: ``FromEmailAddress``,
``Destination.ToAddresses`` (the delivery's address), ``Content.Simple``
(``Subject``, ``Body.Text`` / ``Body.Html``, ``Headers``: ``X-Notify-Id``,
``Auto-Submitted: auto-generated`` on transactional mail, and RFC 8058's
``List-Unsubscribe`` / ``List-Unsubscribe-Post`` when the delivery carries its
``unsubscribe_url``), ``EmailTags``
(``notify_id`` = our delivery id, ``category``) and ``ConfigurationSetName``
when configured (the configuration set whose event destination is the SNS
topic of the bounce / complaint / delivery notifications).

Answers:

* 200 ``{"MessageId": "…"}``: ACCEPTED, ``provider_msg_id`` = the MessageId
  (the ``mail.messageId`` of SES's notifications);
* 429 ``TooManyRequestsException`` (or any throttling code),
  ``LimitExceededException`` (the daily quota): RATE_LIMITED (``Retry-After``
  when sent);
* 400 ``MessageRejected`` (the message contains a virus, the recipient is on
  the account's suppression list, …): PERMANENT_ERROR ``rejected``, except
  "Email address is not verified" (an identity of the account's setup, or the
  SES sandbox): a configuration fault as below;
  ``BadRequestException``: ``invalid_request``;
* ``MailFromDomainNotVerifiedException``, ``AccountSuspendedException``,
  ``SendingPausedException``, ``NotFoundException`` (no such configuration set)
  and 401/403 (credentials, signature, IAM rights): TRANSIENT_ERROR with
  ``fault="config"``: ours to fix, another e-mail provider may take the message;
* 5xx: TRANSIENT_ERROR; transport errors as every HTTP adapter.

SES has no idempotency key and no message status query: :meth:`query` answers
``supported=False``. Receipts: SES publishes Bounce / Complaint / Delivery to an
SNS topic whose HTTPS subscription is our ``POST /v1/receipts/<name>``
(:meth:`adapters.receipts.ReceiptVerifier.sns`).

A send goes straight through the aiohttp session of the adapter's client
(:class:`adapters._http.Route`: signed per call for the URL as httpx sends it),
the same request as through ``httpx.AsyncClient``; ``account()`` goes through the
client; a client given to the constructor is used as it is.
"""

from __future__ import annotations

import email.utils
from dataclasses import dataclass
from typing import Any, Optional

import httpx
import orjson

from pipeline.models import AttemptResult, Delivery

from ._http import Reply, Route, direct_client, timed_send
from .aws_sigv4 import THROTTLE_CODES, AwsSigner, aws_error, aws_result
from .base import PermanentKind, Provider, SendResult, email_bodies, unsubscribe_headers

__all__ = ["SesConfig", "SesProvider"]

#: ours to fix (the account, the domain, the configuration set)
CONFIG_CODES = frozenset({"MailFromDomainNotVerifiedException", "AccountSuspendedException",
                          "SendingPausedException", "NotFoundException", "ConfigurationSetDoesNotExistException",
                          "AccountSendingPausedException", "ConfigurationSetSendingPausedException"})
#: slow down: the account's rate, or its daily quota (LimitExceededException)
RATE_CODES = THROTTLE_CODES | {"LimitExceededException"}
SEND_PATH = "/v2/email/outbound-emails"
_TAG_OK = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.@")


@dataclass
class SesConfig:
    region: str
    access_key_id: str
    secret_access_key: str
    from_addr: str
    session_token: Optional[str] = None
    from_name: Optional[str] = None
    reply_to: Optional[str] = None
    configuration_set: Optional[str] = None
    base_url: Optional[str] = None  #: default ``https://email.<region>.amazonaws.com``
    bulk_categories: tuple[str, ...] = ("marketing",)
    #: read by the receipts endpoint (SNS notifications), not by the adapter: the
    #: topics whose notifications are taken, and extra certificate URL prefixes
    #: allowed besides ``https://sns.<region>.amazonaws.com/`` (a simulator)
    sns_topic_arns: tuple[str, ...] = ()
    sns_cert_urls: tuple[str, ...] = ()
    timeout: float = 10.0
    connect_timeout: float = 5.0
    verify: Any = True
    max_connections: int = 50
    name: str = "ses"

    @property
    def endpoint(self) -> str:
        return (self.base_url or f"https://email.{self.region}.amazonaws.com").rstrip("/")


def _tag(value: str) -> str:
    """An SES tag value: ASCII letters, digits, ``_ - . @``, at most 256."""
    return "".join(ch if ch in _TAG_OK else "_" for ch in value)[:256] or "_"


def _message_id(resp: Reply) -> Optional[str]:
    try:
        doc = resp.json()
    except ValueError:
        doc = None
    msg_id = doc.get("MessageId") if isinstance(doc, dict) else None
    return msg_id if isinstance(msg_id, str) and msg_id else None


def _config_fault(code: Optional[str], message: str) -> bool:
    # "Email address is not verified": the sender identity (or, in the SES sandbox,
    # the recipient) is not verified in this region: the account's setup, not the mail
    return code in CONFIG_CODES or (code == "MessageRejected" and "not verified" in message)


def _permanent_kind(code: Optional[str], message: str) -> str:
    return PermanentKind.REJECTED if code == "MessageRejected" else PermanentKind.INVALID_REQUEST


class SesProvider(Provider):
    channel = "email"

    def __init__(self, config: SesConfig, *, client: Optional[httpx.AsyncClient] = None) -> None:
        self.config = config
        self.name = config.name
        #: sends, straight through the client's transport (None: through the client given)
        self._route: Optional[Route] = None
        if client is None:
            client, direct = direct_client(config, config.endpoint)
            if direct is not None:  # the URL as AwsSigner.request makes it
                self._route = direct.route("POST", str(client.base_url).rstrip("/") + SEND_PATH)
        self._client = client
        self.signer = AwsSigner.for_config(config, "ses")
        self._from = (email.utils.formataddr((config.from_name, config.from_addr)) if config.from_name
                      else config.from_addr)

    def build_body(self, delivery: Delivery) -> dict[str, Any]:
        c = delivery.content or {}
        text, html = email_bodies(c)
        body: dict[str, Any] = {}
        if text is not None:
            body["Text"] = {"Data": str(text), "Charset": "UTF-8"}
        if html:
            body["Html"] = {"Data": str(html), "Charset": "UTF-8"}
        headers = [{"Name": "X-Notify-Id", "Value": delivery.delivery_id}]
        if delivery.category not in self.config.bulk_categories:
            headers.append({"Name": "Auto-Submitted", "Value": "auto-generated"})
        headers += [{"Name": k, "Value": v} for k, v in unsubscribe_headers(c).items()]
        out: dict[str, Any] = {
            "FromEmailAddress": self._from,
            "Destination": {"ToAddresses": [delivery.address]},
            "Content": {"Simple": {"Subject": {"Data": str(c.get("subject") or ""), "Charset": "UTF-8"},
                                   "Body": body, "Headers": headers}},
            "EmailTags": [{"Name": "notify_id", "Value": _tag(delivery.delivery_id)}],
        }
        if delivery.category:
            out["EmailTags"].append({"Name": "category", "Value": _tag(str(delivery.category))})
        if self.config.reply_to:
            out["ReplyToAddresses"] = [self.config.reply_to]
        if self.config.configuration_set:
            out["ConfigurationSetName"] = self.config.configuration_set
        return out

    def _request(self, method: str, path: str, body: bytes = b"") -> httpx.Request:
        headers = {"content-type": "application/json"} if body else {}
        return self.signer.request(self._client, method, path, body=body, headers=headers)

    async def send(self, delivery: Delivery) -> SendResult:
        if "@" not in (delivery.address or ""):
            return SendResult(AttemptResult.PERMANENT_ERROR, self.name, error="no e-mail address",
                              permanent_kind=PermanentKind.INVALID_ADDRESS)
        route = self._route
        if route is not None:
            return await timed_send(self.name, lambda: self._send(route, orjson.dumps(self.build_body(delivery))),
                                    self._map)
        return await timed_send(self.name, lambda: self._client.send(
            self._request("POST", SEND_PATH, orjson.dumps(self.build_body(delivery)))), self._map)

    async def _send(self, route: Route, body: bytes) -> Reply:
        signed = self.signer.sign("POST", route.url_text, body, {"content-type": "application/json"})
        return await route.send(body, tuple(signed.items()))

    def _map(self, resp: Reply, latency_ms: float) -> SendResult:
        return aws_result(self.name, resp, latency_ms, message_id=_message_id, rate_codes=RATE_CODES,
                          config_fault=_config_fault, permanent_kind=_permanent_kind)

    async def account(self) -> tuple[int, dict[str, Any], Optional[str], str]:
        """``GetAccount`` (``GET /v2/email/account``): ``(status, body, error code, message)``;
        the credentials check of ``notify providers check``."""
        resp = await self._client.send(self._request("GET", "/v2/email/account"))
        if resp.status_code == 200:
            try:
                doc = resp.json()
            except ValueError:
                doc = {}
            return 200, doc if isinstance(doc, dict) else {}, None, ""
        code, message = aws_error(resp)
        return resp.status_code, {}, code, message

    async def close(self) -> None:
        await self._client.aclose()
