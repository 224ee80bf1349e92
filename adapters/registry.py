"""Build providers from plain configuration (dicts from TOML/env).

    build_provider("twilio", {"account_sid": "AC…", "auth_token": "…",
                              "from_number": "+1…", "status_callback": "https://…/v1/receipts/twilio"})

``kind`` picks the module; the dict's keys are the fields of that module's
config dataclass (unknown keys are an error, so typos fail loudly). The
provider's ``name`` defaults to the kind and can be overridden with ``name``
(e.g. two Twilio accounts as "sms_a" and "sms_a2").
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from .base import Provider

__all__ = ["PROVIDER_KINDS", "build_provider"]


def _apns(cfg: dict[str, Any]) -> Provider:
    from .apns import ApnsConfig, ApnsProvider

    return ApnsProvider(_make(ApnsConfig, cfg))


def _fcm(cfg: dict[str, Any]) -> Provider:
    from .fcm import FcmConfig, FcmProvider

    sa = cfg.pop("service_account", None)
    if sa is not None:
        return FcmProvider(FcmConfig.from_service_account(sa, **cfg))
    return FcmProvider(_make(FcmConfig, cfg))


def _twilio(cfg: dict[str, Any]) -> Provider:
    from .sms_twilio import TwilioConfig, TwilioSmsProvider

    return TwilioSmsProvider(_make(TwilioConfig, cfg))


def _vendor(cfg: dict[str, Any]) -> Provider:
    from .sms_vendor import VendorSmsConfig, VendorSmsProvider

    return VendorSmsProvider(_make(VendorSmsConfig, cfg))


def _smtp(cfg: dict[str, Any]) -> Provider:
    from .email_smtp import SmtpConfig, SmtpProvider

    return SmtpProvider(_make(SmtpConfig, cfg))


def _webhook(cfg: dict[str, Any]) -> Provider:
    from .webhook import WebhookConfig, WebhookProvider

    if isinstance(cfg.get("allow"), str):
        cfg["allow"] = tuple(x.strip() for x in cfg["allow"].split(",") if x.strip())
    return WebhookProvider(_make(WebhookConfig, cfg))


def _inbox(cfg: dict[str, Any]) -> Provider:
    from .inbox import InboxProvider

    return InboxProvider(cfg.get("name", "inbox"))


PROVIDER_KINDS: dict[str, Callable[[dict[str, Any]], Provider]] = {
    "apns": _apns,
    "fcm": _fcm,
    "twilio": _twilio,
    "smsvendor": _vendor,
    "smtp": _smtp,
    "webhook": _webhook,
    "inbox": _inbox,
}


def _make(cls: Any, cfg: dict[str, Any]) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(cfg) - names
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown settings {sorted(unknown)}")
    return cls(**cfg)


def build_provider(kind: str, config: Mapping[str, Any]) -> Provider:
    try:
        factory = PROVIDER_KINDS[kind]
    except KeyError:
        raise ValueError(f"unknown provider kind {kind!r}; one of {sorted(PROVIDER_KINDS)}") from None
    cfg = dict(config)
    cfg.setdefault("name", kind)
    return factory(cfg)
