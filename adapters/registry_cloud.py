"""The hosted e-mail and SMS APIs as provider kinds (:mod:`adapters.registry` takes
them from here): ``sendgrid`` (e-mail, :mod:`adapters.sendgrid`), ``ses`` (e-mail,
:mod:`adapters.ses`) and ``sns`` (SMS, :mod:`adapters.sns`): each one's factory,
its secrets read from the table's references, its endpoint and the credentials
check of ``notify providers check``:

========  ===================================================================
sendgrid  ``GET /v3/scopes`` with the API key: 200 and ``mail.send`` among the
          key's scopes (nothing sent)
ses       ``GetAccount`` (``GET /v2/email/account``, SigV4): 200, and whether
          sending is enabled and the account is out of the sandbox
sns       ``GetSMSAttributes`` (SigV4): 200 (nothing sent)
========  ===================================================================
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from config.settings import ConfigError, ProviderConfig

from ._http import response_json
from .base import Provider

__all__ = ["CLOUD_KINDS", "CLOUD_PROBES", "cloud_fields", "cloud_endpoint"]


def _sendgrid(cfg: dict[str, Any]) -> Provider:
    from .registry import _make
    from .sendgrid import SendGridConfig, SendGridProvider

    return SendGridProvider(_make(SendGridConfig, cfg))


def _ses(cfg: dict[str, Any]) -> Provider:
    from .registry import _make
    from .ses import SesConfig, SesProvider

    return SesProvider(_make(SesConfig, cfg))


def _sns(cfg: dict[str, Any]) -> Provider:
    from .registry import _make
    from .sns import SnsSmsConfig, SnsSmsProvider

    return SnsSmsProvider(_make(SnsSmsConfig, cfg))


CLOUD_KINDS: dict[str, Callable[[dict[str, Any]], Provider]] = {"sendgrid": _sendgrid, "ses": _ses, "sns": _sns}


def cloud_endpoint(spec: ProviderConfig) -> Optional[str]:
    o = spec.options
    if o.get("base_url"):
        return str(o["base_url"]).rstrip("/")
    if spec.kind == "sendgrid":
        return "https://api.sendgrid.com"
    if spec.kind == "ses":
        return f"https://email.{o.get('region', '?')}.amazonaws.com"
    if spec.kind == "sns":
        return f"https://sns.{o.get('region', '?')}.amazonaws.com"
    return None


def cloud_fields(spec: ProviderConfig, cfg: dict[str, Any], secret: Callable[[str], Optional[str]]) -> dict[str, Any]:
    """``cfg`` (the table's settings) with the kind's secrets read; ConfigError naming
    the key when one is unusable."""
    kind = spec.kind
    for k in ("bulk_categories", "sns_topic_arns", "sns_cert_urls"):
        if k in cfg:
            cfg[k] = tuple(cfg[k])
    if kind == "sendgrid":
        cfg["api_key"] = secret("api_key")
        pub = cfg.get("event_webhook_public_key")
        if pub:
            from .receipts_email import load_sendgrid_key

            try:
                load_sendgrid_key(pub)
            except ValueError as exc:
                key = f"providers.{spec.name}.event_webhook_public_key"
                raise ConfigError(f"{key}: not SendGrid's verification key (base64 DER of an EC public key): "
                                  f"{exc}", key, None) from None
    else:
        if "access_key_id" not in cfg:
            cfg["access_key_id"] = (secret("access_key_id") or "").strip()
        cfg["secret_access_key"] = (secret("secret_access_key") or "").strip()
        token = secret("session_token")
        if token is not None:
            cfg["session_token"] = token.strip()
    return cfg


def _failed(msg: str) -> Exception:
    from .registry import ProbeFailed

    return ProbeFailed(msg[:300])


async def _probe_sendgrid(p: Any, spec: ProviderConfig) -> str:
    resp = await p._client.get("/v3/scopes", headers={"authorization": f"Bearer {p.config.api_key}",
                                                      "accept": "application/json"})
    body = response_json(resp)
    if resp.status_code == 200:
        scopes = body.get("scopes") if isinstance(body.get("scopes"), list) else []
        if "mail.send" not in scopes:
            raise _failed(f"auth: the API key lacks the mail.send scope ({len(scopes)} scopes)")
        return f"API key accepted, scope mail.send; sending as {p.config.from_addr} (GET /v3/scopes, nothing sent)"
    from .sendgrid import sendgrid_errors

    what = "auth: " if resp.status_code in (401, 403) else ""
    detail = "; ".join(m for _, m in sendgrid_errors(body)) or resp.reason_phrase
    raise _failed(f"{what}GET /v3/scopes: {resp.status_code} {detail}")


async def _probe_ses(p: Any, spec: ProviderConfig) -> str:
    status, body, code, message = await p.account()
    if status != 200:
        what = "auth: " if status in (401, 403) else ""
        raise _failed(f"{what}GetAccount: {status} {code or ''} {message}".strip())
    if body.get("SendingEnabled") is False:
        raise _failed(f"GetAccount: sending is disabled for the account in {p.config.region}")
    quota = body.get("SendQuota") if isinstance(body.get("SendQuota"), dict) else {}
    sandbox = "" if body.get("ProductionAccessEnabled", True) else "; in the SES sandbox (verified recipients only)"
    rate = f", {quota.get('MaxSendRate'):g}/s" if isinstance(quota.get("MaxSendRate"), (int, float)) else ""
    return (f"access key {p.config.access_key_id} accepted in {p.config.region} (GetAccount: sending enabled{rate})"
            f"{sandbox}")


async def _probe_sns(p: Any, spec: ProviderConfig) -> str:
    status, attrs, code, message = await p.sms_attributes()
    if status != 200:
        what = "auth: " if status in (401, 403) else ""
        raise _failed(f"{what}GetSMSAttributes: {status} {code or ''} {message}".strip())
    kind = attrs.get("DefaultSMSType")
    return (f"access key {p.config.access_key_id} accepted in {p.config.region} (GetSMSAttributes"
            f"{', default ' + kind if kind else ''}; nothing sent)")


CLOUD_PROBES: dict[str, Callable[[Any, ProviderConfig], Any]] = {
    "sendgrid": _probe_sendgrid, "ses": _probe_ses, "sns": _probe_sns}
