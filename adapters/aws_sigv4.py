"""AWS Signature Version 4 for the AWS adapters (SES, SNS), signed by botocore's
own ``SigV4Auth`` (the signer every AWS SDK for Python uses), never by our
reading of the specification.

:class:`AwsSigner` signs one request (method, URL, body, the headers to sign)
and returns the headers to send: ``Authorization``, ``X-Amz-Date`` and, with
temporary credentials, ``X-Amz-Security-Token``. Only the headers passed in are
signed (plus ``host``, from the URL as httpx sends it), so headers the HTTP
client adds on its own (``accept-encoding``, ``user-agent``) never break a
signature.

:func:`aws_error` reads an AWS error answer in both of the wire forms used here:
the query protocol's XML (SNS: ``<ErrorResponse><Error><Code>``) and REST-JSON
(SES v2: the ``x-amzn-ErrorType`` header, or ``__type`` / ``code`` in the body).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import httpx
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import ReadOnlyCredentials

__all__ = ["AwsSigner", "aws_error", "AUTH_CODES", "THROTTLE_CODES"]

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


def _unxml(s: str) -> str:
    return (s.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"').replace("&apos;", "'")
            .replace("&amp;", "&"))
