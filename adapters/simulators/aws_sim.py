"""What the AWS simulators (SES, SNS) share: checking AWS Signature Version 4 on
an incoming request, written here from the specification (the adapters sign
with botocore, so the two are independent implementations that must agree), the
two error forms (REST-JSON for SES v2, query XML for SNS), and an SNS topic's
signing key: an RSA key with a self-signed certificate the simulator serves,
signing messages as SNS does (SignatureVersion 1: SHA1withRSA, 2: SHA256withRSA
over the canonical string of :func:`adapters.receipts_email.sns_string_to_sign`).
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import re
import secrets
import uuid
from typing import Any, Mapping, Optional
from urllib.parse import parse_qsl, quote

from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

from ..receipts_email import sns_string_to_sign

__all__ = ["check_sigv4", "json_error", "xml_error", "SnsTopicSigner", "new_access_key"]

_AUTH = re.compile(r"^AWS4-HMAC-SHA256\s+Credential=([^,\s]+),\s*SignedHeaders=([^,\s]+),\s*Signature=([0-9a-f]{64})$")
MAX_SKEW_S = 15 * 60


def new_access_key() -> tuple[str, str]:
    """(access key id, secret access key), shaped as AWS's."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
    return "AKIA" + "".join(secrets.choice(alphabet) for _ in range(16)), secrets.token_urlsafe(30)[:40]


def _uri_encode(s: str, safe: str = "-_.~") -> str:
    return quote(s, safe=safe)


def _canonical_query(query: str) -> str:
    pairs = parse_qsl(query, keep_blank_values=True)
    return "&".join(f"{_uri_encode(k)}={_uri_encode(v)}" for k, v in sorted(pairs))


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def check_sigv4(request: web.Request, body: bytes, keys: Mapping[str, str], region: str, service: str,
                now: Optional[dt.datetime] = None) -> Optional[tuple[str, str]]:
    """None when ``request`` is signed by one of ``keys`` (access key id → secret) for
    ``region`` / ``service``; else ``(error code, message)`` as AWS names them."""
    header = request.headers.get("Authorization", "")
    if not header:
        return "MissingAuthenticationToken", "Request is missing Authentication Token"
    m = _AUTH.match(header.strip())
    if not m:
        return "IncompleteSignature", "Authorization header requires Credential, SignedHeaders and Signature"
    credential, signed_headers, signature = m.groups()
    parts = credential.split("/")
    if len(parts) != 5 or parts[4] != "aws4_request":
        return "IncompleteSignature", "Credential is not <key>/<date>/<region>/<service>/aws4_request"
    akid, day, reg, svc, _ = parts
    secret = keys.get(akid)
    if secret is None:
        return "InvalidClientTokenId", "The security token included in the request is invalid."
    if reg != region or svc != service:
        return "SignatureDoesNotMatch", f"Credential should be scoped to a valid region/service ({region}/{service})"
    amz_date = request.headers.get("X-Amz-Date", "")
    try:
        t = dt.datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.timezone.utc)
    except ValueError:
        return "IncompleteSignature", "X-Amz-Date missing or malformed"
    if not amz_date.startswith(day):
        return "SignatureDoesNotMatch", "Credential date does not match X-Amz-Date"
    now = now or dt.datetime.now(dt.timezone.utc)
    if abs((now - t).total_seconds()) > MAX_SKEW_S:
        return "RequestExpired", "Signature expired: the request time is more than 15 minutes from now"
    names = signed_headers.split(";")
    if "host" not in names:
        return "SignatureDoesNotMatch", "host must be signed"
    canon_headers = ""
    for name in names:
        values = request.headers.getall(name, None)
        if values is None:
            return "SignatureDoesNotMatch", f"signed header {name} is missing"
        canon_headers += f"{name}:{','.join(' '.join(v.split()) for v in values)}\n"
    canonical = "\n".join([
        request.method,
        _uri_encode(request.path, safe="/-_.~"),
        _canonical_query(request.query_string),
        canon_headers,
        signed_headers,
        hashlib.sha256(body).hexdigest(),
    ])
    scope = f"{day}/{reg}/{svc}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    k = _hmac(("AWS4" + secret).encode(), day)
    k = _hmac(_hmac(_hmac(k, reg), svc), "aws4_request")
    expected = hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, signature):
        return ("SignatureDoesNotMatch", "The request signature we calculated does not match the signature you "
                "provided. Check your AWS Secret Access Key and signing method.")
    return None


def json_error(status: int, code: str, message: str, headers: Optional[dict[str, str]] = None) -> web.Response:
    """A REST-JSON error (SES v2): the type in ``x-amzn-ErrorType``, ``{"message"}``."""
    h = {"x-amzn-ErrorType": f"{code}:http://internal.amazon.com/coral/com.amazonaws.sesv2/",
         "x-amzn-RequestId": str(uuid.uuid4()), **(headers or {})}
    return web.json_response({"message": message}, status=status, headers=h)


def _esc(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def xml_error(status: int, code: str, message: str, sender: bool = True,
              headers: Optional[dict[str, str]] = None) -> web.Response:
    """A query-protocol error (SNS): ``<ErrorResponse><Error><Type><Code><Message>``."""
    body = (f'<ErrorResponse xmlns="http://sns.amazonaws.com/doc/2010-03-31/">\n  <Error>\n'
            f'    <Type>{"Sender" if sender else "Receiver"}</Type>\n    <Code>{_esc(code)}</Code>\n'
            f'    <Message>{_esc(message)}</Message>\n  </Error>\n  <RequestId>{uuid.uuid4()}</RequestId>\n'
            f'</ErrorResponse>\n')
    return web.Response(status=status, text=body, content_type="text/xml", headers=headers)


class SnsTopicSigner:
    """An SNS topic's signing: an RSA-2048 key and its self-signed certificate (served
    by the simulator at :attr:`cert_path`), signing messages as SNS does."""

    def __init__(self, region: str = "us-east-1", account: str = "123456789012", topic: str = "ses-events",
                 signature_version: str = "1") -> None:
        self.region = region
        self.topic_arn = f"arn:aws:sns:{region}:{account}:{topic}"
        self.signature_version = signature_version
        self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"sns.{region}.amazonaws.com")])
        now = dt.datetime.now(dt.timezone.utc)
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(self._key.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
                .not_valid_after(now + dt.timedelta(days=2)).sign(self._key, hashes.SHA256()))
        self.cert_pem = cert.public_bytes(serialization.Encoding.PEM)
        self.cert_path = f"/SimpleNotificationService-{secrets.token_hex(16)}.pem"

    def sign(self, msg: dict[str, Any], version: Optional[str] = None) -> dict[str, Any]:
        version = version or self.signature_version
        algo = hashes.SHA1() if version == "1" else hashes.SHA256()
        msg["SignatureVersion"] = version
        sig = self._key.sign(sns_string_to_sign(msg), padding.PKCS1v15(), algo)
        msg["Signature"] = base64.b64encode(sig).decode()
        return msg

    def message(self, base_url: str, kind: str, message: str, *, subject: Optional[str] = None,
                token: Optional[str] = None) -> dict[str, Any]:
        """A signed SNS message of ``kind`` (Notification / SubscriptionConfirmation)."""
        msg: dict[str, Any] = {"Type": kind, "MessageId": str(uuid.uuid4()), "TopicArn": self.topic_arn}
        if kind != "Notification":
            msg["Token"] = token or secrets.token_hex(32)
            msg["SubscribeURL"] = (f"{base_url}/?Action=ConfirmSubscription&TopicArn={quote(self.topic_arn)}"
                                   f"&Token={msg['Token']}")
        elif subject is not None:
            msg["Subject"] = subject
        msg["Message"] = message
        msg["Timestamp"] = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        msg["SigningCertURL"] = base_url + self.cert_path
        if kind == "Notification":
            msg["UnsubscribeURL"] = f"{base_url}/?Action=Unsubscribe&SubscriptionArn={quote(self.topic_arn)}:sub"
        return self.sign(msg)
