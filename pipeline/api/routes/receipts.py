"""``POST /v1/receipts/{provider}``: providers' delivery receipts, verified
(signature, age, replay) and produced to ``notify.receipts``.

``twilio`` and ``smsvendor`` by those names (their secrets: NOTIFY_TWILIO_AUTH_TOKEN,
NOTIFY_VENDOR_SECRET); a provider of the config of kind sendgrid or ses, or of kind
hms (Huawei Push Kit: its callback user name and key), by its own name, verified
with its own settings; ``hms`` for the Push Kit simulator of ``notify run``
(NOTIFY_HMS_RECEIPT_KEY) when no provider of that name has a kind.

The verification is the adapters' (``adapters/receipts.py``,
``adapters/receipts_email.py``); this module takes it as an object
(:class:`ReceiptAdapters`), so it imports nothing from ``adapters``.

``<ns>:api:receipt-seen:<scheme>:<sig>``
    The receipt replay guard (``SET NX PX``), see ``adapters/receipts.py``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Optional

from aiohttp import web

from pipeline import topics as T

from .. import metrics_lag as M
from ..auth import SIGNED, requires
from ..errors import api_error, json_response
from ..state import Api
from . import Routes

__all__ = ["Receipts", "ReceiptAdapters", "PROVIDERS"]

PROVIDERS = ("twilio", "smsvendor")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReceiptAdapters:
    """What the route needs from the adapters: ``verifier(**kw)`` builds a
    verifier (``adapters.receipts.ReceiptVerifier``) whose ``twilio_request``
    and ``vendor`` read a callback; ``rejected`` is the error it raises
    (``.reason``, ``.detail``, ``.field``); ``replay_guard(client, prefix=)``
    the Redis replay guard; ``email_config(providers, name)`` a sendgrid or ses
    provider's verification settings (None for other names) and
    ``email_receipts(verifier, scheme, body, headers)`` reads its callback;
    ``hms_config(providers, name, simulator_key=)`` a Push Kit provider's (kind hms)
    verifier arguments, or None, raising ``config_error`` when its callback key cannot
    be read; ``hms_header`` the header its callbacks carry (the verifier's ``hms``
    reads them)."""

    verifier: Callable[..., Any]
    rejected: type[Exception]
    replay_guard: Callable[..., Any]
    email_config: Callable[[Any, str], Any]
    email_receipts: Callable[..., Any]
    hms_config: Optional[Callable[..., Any]] = None
    config_error: type[Exception] = LookupError
    hms_header: str = "X-HUAWEI-CALLBACK-ID"

    @classmethod
    def default(cls) -> "ReceiptAdapters":
        """The adapters' own (the API's one arrow to ``adapters``, taken when the
        application is built without ``receipts=``)."""
        from adapters.receipts import (HMS_CALLBACK_HEADER, ReceiptRejected, ReceiptVerifier, RedisReplayGuard,
                                       hms_receipt_config)
        from adapters.receipts_email import email_receipt_config, email_receipts
        from config.settings import ConfigError

        return cls(verifier=ReceiptVerifier, rejected=ReceiptRejected, replay_guard=RedisReplayGuard,
                   email_config=email_receipt_config, email_receipts=email_receipts,
                   hms_config=hms_receipt_config, config_error=ConfigError, hms_header=HMS_CALLBACK_HEADER)


class _TrackingGuard:
    """The Redis replay guard, remembering what this request marked as seen, so
    a receipt we failed to write can be retried by the provider."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.marked: list[str] = []

    async def first_seen(self, key: str, ttl: float) -> bool:
        fresh = await self.inner.first_seen(key, ttl)
        if fresh:
            self.marked.append(key)
        return fresh

    async def forget(self) -> None:
        if self.marked:
            await self.inner.redis.delete(*(self.inner.prefix + k for k in self.marked))


class Receipts(Routes):
    def __init__(self, api: Api, adapters: ReceiptAdapters) -> None:
        super().__init__(api)
        self.adapters = adapters
        # a Push Kit provider whose callback key cannot be read: said at start, not at its first receipt
        for name, spec in (getattr(api.settings, "providers", None) or {}).items():
            if getattr(spec, "kind", None) == "hms" and adapters.hms_config is not None:
                try:
                    adapters.hms_config({name: spec}, name)
                except adapters.config_error as exc:
                    log.warning("receipts of provider %s will be refused (503) until this is fixed: %s", name, exc)

    def add_to(self, router: web.UrlDispatcher) -> None:
        router.add_post("/v1/receipts/{provider}", self.post_receipt)

    @requires(SIGNED)
    async def post_receipt(self, request: web.Request) -> web.Response:
        api, ad = self.api, self.adapters
        assert api.writer is not None
        provider = request.match_info["provider"]
        providers = getattr(api.settings, "providers", None) or {}
        # a [providers.<name>] of kind sendgrid or ses: its events, verified with its own settings
        mail_cfg = ad.email_config(providers, provider)
        # one of kind hms (Huawei Push Kit): its callback user name and key
        hms_cfg = None
        if mail_cfg is None and provider not in PROVIDERS and ad.hms_config is not None:
            try:
                hms_cfg = ad.hms_config(providers, provider, simulator_key=api.hms_receipt_key)
            except ad.config_error as exc:  # its key's variable unset, its file unreadable: ours to fix
                log.error("receipts of provider %s refused (503): %s", provider, exc)
                M.receipts_rejected.labels(provider, "unavailable").inc()
                raise api_error(503, "receipts_unavailable", "this provider's receipt credentials are not "
                                "available; try again later") from None
        if provider not in PROVIDERS and mail_cfg is None and hms_cfg is None:
            raise api_error(404, "unknown_provider", f"receipts are taken for {', '.join(PROVIDERS)} and the "
                            f"providers of kind sendgrid, ses or hms", field="provider")
        guard = _TrackingGuard(ad.replay_guard(api.client, prefix=f"{api.ns}:api:receipt-seen:", wire=api.wire))
        conf = getattr(api.settings, "api", None)
        bounds = {} if conf is None else {"receipt_max_age": conf.receipt_max_age_s,
                                          "receipt_max_ahead": conf.receipt_max_ahead_s}
        verifier = ad.verifier(twilio_auth_token=api.twilio_auth_token, vendor_secret=api.vendor_secret,
                               guard=guard, **bounds, **(mail_cfg["verifier"] if mail_cfg else {}),
                               **(hms_cfg or {}))
        body = await self.read(request)
        try:
            if mail_cfg is not None:
                receipts = await ad.email_receipts(verifier, mail_cfg["scheme"], body, request.headers)
            elif hms_cfg is not None:
                receipts = await verifier.hms(body, request.headers.get(ad.hms_header))
            elif provider == "twilio":
                # the full URL Twilio called (its signature covers the query string), the
                # raw body (a form, or JSON with bodySHA256) and the signature headers
                url = (api.public_url + str(request.rel_url)) if api.public_url else str(request.url)
                one = await verifier.twilio_request(url, request.content_type, body, request.headers)
                receipts = [one] if one is not None else []
            else:
                receipts = await verifier.vendor(
                    body, request.headers.get("X-Vendor-Timestamp"), request.headers.get("X-Vendor-Signature")
                )
        except ad.rejected as exc:
            reason, detail, field = exc.reason, exc.detail, exc.field  # type: ignore[attr-defined]
            M.receipts_rejected.labels(provider, reason).inc()
            if reason == "malformed":
                raise api_error(400, "malformed", detail or "malformed receipt", field=field) from None
            raise api_error(401, reason, detail or reason) from None
        if receipts:
            try:
                await api.writer.send(
                    [(T.RECEIPTS, r.provider_msg_id.encode(), r.dumps(), []) for r in receipts]
                )
            except BaseException:
                await guard.forget()  # let the provider's retry through
                raise
            for r in receipts:
                M.receipts_received.labels(provider, r.status).inc()
        return json_response({"received": len(receipts)})

    #: a callback URL may carry any query string (ours to choose; Twilio signs it)
    post_receipt.query = None  # type: ignore[attr-defined]
