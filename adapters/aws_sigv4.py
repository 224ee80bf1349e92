"""What the AWS adapters (SES, SNS) share: AWS Signature Version 4, signed by
botocore's own ``SigV4Auth`` (the signer every AWS SDK for Python uses), never by
our reading of the specification, and the reading of AWS answers.

:class:`AwsSigner` signs one request (method, URL, body, the headers to sign)
and returns the headers to send: ``Authorization``, ``X-Amz-Date`` and, with
temporary credentials, ``X-Amz-Security-Token``. Only the headers passed in are
signed (plus ``host``, from the URL as httpx sends it), so headers the HTTP
client adds on its own (``accept-encoding``, ``user-agent``) never break a
signature.

:func:`aws_error` reads an AWS error answer in both of the wire forms used here:
the query protocol's XML (SNS: ``<ErrorResponse><Error><Code>``) and REST-JSON
(SES v2: the ``x-amzn-ErrorType`` header, or ``__type`` / ``code`` in the body).
:func:`aws_result` maps a send's answer to a SendResult as both adapters do:
200 with a MessageId → ACCEPTED (without one: TIMEOUT_UNKNOWN); throttling →
RATE_LIMITED; 401/403 and the credential codes → TRANSIENT_ERROR ``auth: …``
with ``fault="config"``; the adapter's own configuration faults → TRANSIENT_ERROR
``config: …``; 5xx, 408 → TRANSIENT_ERROR; anything else PERMANENT_ERROR of the
kind the adapter names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

import httpx
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import ReadOnlyCredentials

from pipeline.models import AttemptResult

from .base import Fault, SendResult, parse_retry_after

__all__ = ["AwsSigner", "aws_error", "aws_result", "AUTH_CODES", "THROTTLE_CODES"]

#: our credentials or their rights (a configuration fault, not the recipient's)
AUTH_CODES = frozenset({
    "InvalidClientTokenId", "UnrecognizedClientException", "SignatureDoesNotMatch", "InvalidSignatureException",
    "IncompleteSignature", "MissingAuthenticationToken", "AuthFailure", "AuthorizationError", "AccessDenied",
    "AccessDeniedException", "ExpiredToken", "ExpiredTokenException", "RequestExpired", "OptInRequired",
    "InvalidAccessKeyId", "SecurityTokenInvalid",
})
#: the account's rate (or a service-wide one): slow down
THROTTLE_CODES = frozenset({
    "Throttling", "ThrottlingException", "ThrottledException", "TooManyRequestsException", "RequestLimitExceeded",
    "SlowDown", "ProvisionedThroughputExceededException",
})


@dataclass(frozen=True)
class AwsSigner:
    """Signs requests for one service in one region with static credentials."""

    access_key_id: str
    secret_access_key: str
    region: str
    service: str
    session_token: Optional[str] = None

    @classmethod
    def for_config(cls, config: Any, service: str) -> "AwsSigner":
        """The signer of an adapter config's ``region``, ``access_key_id``,
        ``secret_access_key`` and ``session_token``."""
        return cls(config.access_key_id, config.secret_access_key, config.region, service, config.session_token)

    def _auth(self) -> SigV4Auth:
        creds = ReadOnlyCredentials(self.access_key_id, self.secret_access_key, self.session_token)
        return SigV4Auth(creds, self.service, self.region)

    def sign(self, method: str, url: str, body: bytes = b"", headers: Optional[Mapping[str, str]] = None) -> dict[str, str]:
        """``headers`` (those to sign, e.g. Content-Type) with the signature headers
        added. ``url``: the full URL as it will be sent (query string included)."""
        req = AWSRequest(method=method, url=url, data=body, headers=dict(headers or {}))
        self._auth().add_auth(req)
        return {k: v for k, v in req.headers.items()}

    def request(self, client: httpx.AsyncClient, method: str, path: str, *, body: bytes = b"",
                headers: Optional[Mapping[str, str]] = None) -> httpx.Request:
        """An httpx request to ``client``'s base URL + ``path`` (a path prefix of the base
        URL kept, as httpx merges relative URLs), signed."""
        url = httpx.URL(str(client.base_url).rstrip("/") + (path or "/"))
        signed = self.sign(method, str(url), body, headers)
        return client.build_request(method, url, content=body or None, headers=signed)


_TYPE_SUFFIX = re.compile(r"[:#].*$")


def aws_error(resp: httpx.Response) -> tuple[Optional[str], str]:
    """``(code, message)`` of an AWS error answer (query XML or REST-JSON); code None
    when the body names none."""
    code: Optional[str] = None
    message = ""
    etype = resp.headers.get("x-amzn-errortype")
    if etype:
        code = _TYPE_SUFFIX.sub("", etype.strip()) or None
    text = resp.text[:4096] if resp.content else ""
    if text.lstrip().startswith("<"):
        m = re.search(r"<Code>([^<]{1,128})</Code>", text)
        if m:
            code = code or m.group(1).strip()
        m = re.search(r"<Message>([^<]{0,500})</Message>", text)
        if m:
            message = _unxml(m.group(1).strip())
    else:
        try:
            doc: Any = resp.json()
        except ValueError:
            doc = None
        if isinstance(doc, dict):
            raw = doc.get("__type") or doc.get("code") or doc.get("Code")
            if isinstance(raw, str) and not code:
                code = _TYPE_SUFFIX.sub("", raw.rpartition("#")[2] if "#" in raw else raw) or None
            msg = doc.get("message") or doc.get("Message")
            if isinstance(msg, str):
                message = msg
    return code, message[:300]


def _no_config_fault(code: Optional[str], message: str) -> bool:
    return False


def aws_result(
    provider: str,
    resp: httpx.Response,
    latency_ms: float,
    *,
    message_id: Callable[[httpx.Response], Optional[str]],
    permanent_kind: Callable[[Optional[str], str], str],
    rate_codes: frozenset[str] = THROTTLE_CODES,
    config_fault: Callable[[Optional[str], str], bool] = _no_config_fault,
) -> SendResult:
    """The SendResult of an AWS send's answer. ``message_id(resp)``: the MessageId
    of a 200; ``rate_codes``: the error codes that mean slow down; ``config_fault(code,
    message)``: an error of the account's setup (``config: …``, ``fault="config"``);
    ``permanent_kind(code, message)``: the kind of any other refusal."""
    status = resp.status_code
    if status == 200:
        msg_id = message_id(resp)
        if msg_id:
            return SendResult(AttemptResult.ACCEPTED, provider, provider_msg_id=msg_id, latency_ms=latency_ms)
        return SendResult(AttemptResult.TIMEOUT_UNKNOWN, provider, error=f"{status} without a MessageId",
                          latency_ms=latency_ms)
    code, message = aws_error(resp)
    error = f"{status} {code or ''} {message or resp.reason_phrase}".strip()[:300]
    retry_after = parse_retry_after(resp.headers.get("retry-after"))
    if status == 429 or code in rate_codes:
        return SendResult(AttemptResult.RATE_LIMITED, provider, error=error, retry_after=retry_after,
                          latency_ms=latency_ms)
    if status in (401, 403) or code in AUTH_CODES:
        return SendResult(AttemptResult.TRANSIENT_ERROR, provider, error=f"auth: {error}"[:300], fault=Fault.CONFIG,
                          latency_ms=latency_ms)
    if config_fault(code, message):
        return SendResult(AttemptResult.TRANSIENT_ERROR, provider, error=f"config: {error}"[:300],
                          fault=Fault.CONFIG, latency_ms=latency_ms)
    if status >= 500 or status == 408:
        return SendResult(AttemptResult.TRANSIENT_ERROR, provider, error=error, retry_after=retry_after,
                          latency_ms=latency_ms)
    return SendResult(AttemptResult.PERMANENT_ERROR, provider, error=error,
                      permanent_kind=permanent_kind(code, message), latency_ms=latency_ms)


def _unxml(s: str) -> str:
    return (s.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"').replace("&apos;", "'")
            .replace("&amp;", "&"))
