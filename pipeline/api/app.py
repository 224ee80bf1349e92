"""The HTTP API: an aiohttp application over the broker (Redis Streams) and the
record store (SQLite). It runs no Faust worker: writes go straight into the
topics' streams (:mod:`.producer`), reads come from the record store, the
idempotency records and the preferences read model in Redis.

This module assembles the application: the shared state (:mod:`.state`), the
middlewares, and the routes, one module per resource (:mod:`.routes`).

Endpoints and scopes (``Authorization: Bearer <key>``, see :mod:`.auth`)::

    POST   /v1/events                          events:write      routes/events.py
    GET    /v1/notifications/{id}              records:read      routes/records.py
    GET    /v1/notifications                   records:read      routes/records.py
    GET    /v1/slo                             records:read      routes/slo.py
    GET    /v1/releases, PUT/DELETE /v1/releases/{name}   admin  routes/releases.py
    GET    /v1/users/{id}/preferences          users:read        routes/preferences.py
    PUT    /v1/users/{id}/preferences          users:write       routes/preferences.py
    PUT    /v1/users/{id}/devices/{token}      users:write       routes/devices.py
    DELETE /v1/users/{id}/devices/{token}      users:write       routes/devices.py
    GET    /v1/users/{id}/inbox                users:read        routes/inbox.py
    POST   /v1/users/{id}/inbox/read           users:write       routes/inbox.py
    GET    /t/c/{token}, /t/o/{token}.gif      open (signed token) routes/tracking.py
    GET    /u/{token}, POST /u/{token}          open (signed token) routes/unsubscribe.py (RFC 8058 one-click)
    POST   /v1/reads                           users:write       routes/tracking.py
    GET    /v1/stats, /v1/unsubscribes         records:read      routes/tracking.py
    POST   /v1/receipts/{provider}             provider signature (twilio, smsvendor; a sendgrid or ses
                                               provider's name)  routes/receipts.py
    GET    /  /healthz  /metrics  /v1/status.json  /v1/openapi.json     open   routes/health.py

Redis keys of the API (``<ns>`` is the transport's prefix, ``nfs`` by default):
``<ns>:api:biz:<biz_key>`` (:mod:`.idempotency`), ``<ns>:api:prefs``
(:mod:`.routes.preferences`), ``<ns>:api:receipt-seen:<scheme>:<sig>``
(:mod:`.routes.receipts`).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Optional

from aiohttp import web

from . import metrics_lag as M
from .auth import KeyStore, auth_middleware
from .errors import error_middleware
from .idempotency import CLAIM_TTL, DEFAULT_IDEMPOTENCY_TTL, fingerprint
from .routes.devices import Devices
from .routes.events import Events
from .routes.health import Health
from .routes.inbox import Inbox
from .routes.preferences import Preferences
from .routes.receipts import PROVIDERS, ReceiptAdapters, Receipts
from .routes.records import Records
from .routes.releases import Releases
from .routes.slo import Slo
from .routes.tracking import Tracking
from .routes.unsubscribe import Unsubscribe
from .state import BROKER_POOL, Api

__all__ = ["make_app", "Api", "API_KEY", "DEFAULT_IDEMPOTENCY_TTL",
           # importable from here as before the split
           "BROKER_POOL", "CLAIM_TTL", "PROVIDERS", "fingerprint"]

log = logging.getLogger("notify.api")

API_KEY = web.AppKey("notify_api", "Api")


def _metrics_middleware():
    @web.middleware
    async def middleware(request: web.Request, handler) -> web.StreamResponse:
        started = time.perf_counter()
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else "unmatched"
        status = 500
        try:
            resp = await handler(request)
            status = resp.status
            return resp
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            M.api_requests.labels(request.method, route, str(status)).inc()
            M.api_latency.labels(route).observe(time.perf_counter() - started)

    return middleware


def _environment_defaults(
    settings: Any,
    *,
    keys_path: Optional[str],
    bootstrap_key: Optional[str],
    twilio_auth_token: Optional[str],
    vendor_secret: Optional[str],
    public_url: Optional[str],
    idempotency_ttl: Optional[int],
    hms_receipt_key: Optional[str] = None,
) -> dict[str, Any]:
    """The arguments of :func:`make_app` the caller left None, from the settings
    (``settings.env``: the process's NOTIFY_* knobs, config/environment.py)."""
    env = settings.env
    if keys_path is None:
        keys_path = os.path.join(settings.data_dir, "api_keys.json")
    if bootstrap_key is None:
        bootstrap_key = env.api_key
    if twilio_auth_token is None:
        twilio_auth_token = env.twilio_auth_token
    if vendor_secret is None:
        vendor_secret = env.vendor_secret
    if hms_receipt_key is None:
        hms_receipt_key = env.hms_receipt_key
    if public_url is None:
        public_url = env.api_public_url
    if idempotency_ttl is None:
        idempotency_ttl = int(env.api_idempotency_ttl or DEFAULT_IDEMPOTENCY_TTL)
    return {"keys_path": keys_path, "bootstrap_key": bootstrap_key, "twilio_auth_token": twilio_auth_token,
            "vendor_secret": vendor_secret, "public_url": public_url, "idempotency_ttl": idempotency_ttl,
            "hms_receipt_key": hms_receipt_key}


def make_app(
    settings: Any,
    *,
    broker_url: str,
    store_path: str,
    keys_path: Optional[str] = None,
    bootstrap_key: Optional[str] = None,
    twilio_auth_token: Optional[str] = None,
    vendor_secret: Optional[str] = None,
    public_url: Optional[str] = None,
    idempotency_ttl: Optional[int] = None,
    batch_max_events: int = 500,
    batch_max_bytes: int = 4 << 20,
    renderer: Any = None,
    receipts: Optional[ReceiptAdapters] = None,
    hms_receipt_key: Optional[str] = None,
) -> web.Application:
    """The API application. Connects to the broker and opens the record store on
    startup (``broker_url`` is a ``redis://``/``rediss://`` URL; a ``prefix``
    query option is honoured like the transport's).

    Secrets default to the environment: ``NOTIFY_API_KEY`` (bootstrap key, all
    scopes), ``NOTIFY_TWILIO_AUTH_TOKEN``, ``NOTIFY_VENDOR_SECRET``, ``NOTIFY_HMS_RECEIPT_KEY``
    (the Push Kit simulator's receipt callback key, ``/v1/receipts/hms``);
    ``NOTIFY_API_PUBLIC_URL`` is the externally visible base URL (Twilio signs
    the URL it called: set it behind a proxy); ``NOTIFY_API_IDEMPOTENCY_TTL``
    (seconds) how long a biz_key is remembered.

    Bodies are capped at ``max(settings.max_event_bytes, batch_max_bytes)``
    (413 above); a batch holds at most ``batch_max_events`` events (413).
    ``receipts``: the receipt verification (default: the adapters').
    """
    conf = _environment_defaults(
        settings, keys_path=keys_path, bootstrap_key=bootstrap_key, twilio_auth_token=twilio_auth_token,
        vendor_secret=vendor_secret, public_url=public_url, idempotency_ttl=idempotency_ttl,
        hms_receipt_key=hms_receipt_key,
    )
    if renderer is None:
        from pipeline.templates import Renderer

        renderer = Renderer.from_settings(settings)
    keys = KeyStore(conf["keys_path"], bootstrap_key=conf["bootstrap_key"])
    if not len(keys):
        log.warning("no API keys in %s and no NOTIFY_API_KEY: every authenticated endpoint answers 401 "
                    "(create one with `notify keys add <producer> --scopes ...`)", conf["keys_path"])
    api = Api(
        settings, broker_url=broker_url, store_path=str(store_path), keys=keys, renderer=renderer,
        twilio_auth_token=conf["twilio_auth_token"], vendor_secret=conf["vendor_secret"],
        public_url=conf["public_url"], idempotency_ttl=conf["idempotency_ttl"], batch_max_events=batch_max_events,
        hms_receipt_key=conf["hms_receipt_key"],
    )
    if settings.tracking.enabled:  # the key the workers sign links with (pipeline/keyfile.py)
        from pipeline.keyfile import tracking_key

        api.tracking_key = tracking_key(settings)
    else:
        api.tracking_key = None
    app = web.Application(
        client_max_size=max(settings.max_event_bytes + 1024, batch_max_bytes),
        middlewares=[_metrics_middleware(), error_middleware, auth_middleware(keys)],
    )
    app[API_KEY] = api

    async def lifecycle(_app: web.Application):
        await api.start()
        try:
            yield
        finally:
            await api.stop()

    app.cleanup_ctx.append(lifecycle)
    # in this order: "/" and the open endpoints first, receipts last
    for routes in (
        Health(api), Events(api), Records(api), Slo(api), Releases(api), Preferences(api), Devices(api),
        Inbox(api), Tracking(api), Unsubscribe(api), Receipts(api, receipts or ReceiptAdapters.default()),
    ):
        routes.add_to(app.router)
    return app
