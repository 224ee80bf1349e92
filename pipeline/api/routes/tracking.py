"""Tracking (README "Tracking", docs/SCHEMA.md "Tracking"):

``GET /t/c/{token}``       open: the token is the authority (signed,
                           pipeline/rules/tracking.py); records the click, 302
                           to the link's target. A bad token: 404, never echoed.
``GET /t/o/{token}.gif``   open, ``[tracking] open_pixel`` only: an email's open
                           (a read of kind ``email_open``), a 1×1 GIF.
``POST /v1/reads``         users:write: reads the app reports (``push_open``,
                           ``inbox``, ``email_open``), of the caller's producer's
                           deliveries (every producer's with ``admin``).
``GET /v1/stats``          records:read: delivery, click and read rates per
                           template and channel (``since``/``until``; default
                           the last 24 h), the caller's producer's records.
``GET /v1/unsubscribes``   records:read: opt-outs newest first (``user_id``,
                           ``since``, ``limit``), the caller's producer's.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import time

from aiohttp import web

from pipeline.rules import slo
from pipeline.rules import tracking as T

from ..auth import OPEN, requires
from ..errors import api_error, json_response
from ..request import int_param, reader_scope
from . import Routes

__all__ = ["Tracking", "READ_KINDS"]

log = logging.getLogger("notify.api")

READ_KINDS = ("push_open", "inbox", "email_open")
_GIF = base64.b64decode("R0lGODlhAQABAIAAAAAAAP///yH5BAEAAAAALAAAAAABAAEAAAIBRAA7")
_NO_STORE = {"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"}
_MAX_READS = 1000


def _times(request: web.Request, default_s: float = 86400.0) -> tuple[float, float]:
    q, now = request.query, time.time()
    field = "since"
    try:
        since = slo.parse_time(q["since"]) if "since" in q else now - default_s
        field = "until"
        until = slo.parse_time(q["until"]) if "until" in q else now + 1
    except ValueError as exc:
        raise api_error(400, "bad_value", str(exc), field=field) from None
    if until <= since:
        raise api_error(400, "bad_value", "until must be after since", field="until")
    return since, until


class Tracking(Routes):
    def add_to(self, router: web.UrlDispatcher) -> None:
        router.add_get("/t/c/{token}", self.click, allow_head=False)
        router.add_get("/t/o/{token}.gif", self.open_pixel, allow_head=False)
        router.add_post("/v1/reads", self.post_reads)
        router.add_get("/v1/stats", self.get_stats, allow_head=False)
        router.add_get("/v1/unsubscribes", self.get_unsubscribes, allow_head=False)

    @property
    def key(self) -> bytes | None:
        return getattr(self.api, "tracking_key", None)

    @requires(OPEN)
    async def click(self, request: web.Request) -> web.StreamResponse:
        key = self.key
        link = T.verify_click(key, request.match_info["token"]) if key else None
        if link is None:
            raise api_error(404, "not_found", "no such link")
        ua = request.headers.get("User-Agent")
        ua_hash = hashlib.sha256(ua.encode("utf-8", "replace")).hexdigest()[:16] if ua else None
        try:
            assert self.api.store is not None
            await self.api.store.add_click(link.delivery_id, link.index, link.url, ua_hash=ua_hash)
        except Exception:  # noqa: BLE001 - the reader still gets where the link goes
            log.warning("could not record a click of %s", link.delivery_id, exc_info=True)
        raise web.HTTPFound(link.url, headers=_NO_STORE)

    @requires(OPEN)
    async def open_pixel(self, request: web.Request) -> web.Response:
        key = self.key
        did = T.verify_open(key, request.match_info["token"]) if key and self.api.settings.tracking.open_pixel else None
        if did is None:
            raise api_error(404, "not_found", "no such image")
        try:
            assert self.api.store is not None
            await self.api.store.add_reads([(did, "email_open", time.time())])
        except Exception:  # noqa: BLE001
            log.warning("could not record an open of %s", did, exc_info=True)
        return web.Response(body=_GIF, content_type="image/gif", headers=_NO_STORE)

    @requires("users:write")
    async def post_reads(self, request: web.Request) -> web.Response:
        """``{"reads": [{"delivery_id": "n_….push", "kind": "push_open", "at": 1.7e9}]}``
        (``kind`` default ``push_open``, ``at`` default now; a push's device
        delivery id counts for its record). Unknown deliveries, or another
        producer's, are ignored (counted)."""
        body = await self.json_body(request)
        items = body.get("reads") if isinstance(body, dict) else None
        if not isinstance(items, list) or not items:
            raise api_error(400, "missing_field", 'the body is {"reads": [{"delivery_id": …, "kind": …}]}',
                            field="reads")
        if len(items) > _MAX_READS:
            raise api_error(400, "bad_value", f"at most {_MAX_READS} reads at once", field="reads")
        now, rows = time.time(), []
        for i, it in enumerate(items):
            if not isinstance(it, dict) or not isinstance(it.get("delivery_id"), str) \
                    or not 0 < len(it["delivery_id"]) <= 200:
                raise api_error(400, "wrong_type", "each read has a delivery_id string", field=f"reads[{i}]")
            kind = it.get("kind", "push_open")
            if kind not in READ_KINDS:
                raise api_error(400, "bad_value", f"kind is one of {', '.join(READ_KINDS)}",
                                field=f"reads[{i}].kind")
            at = it.get("at", now)
            if isinstance(at, bool) or not isinstance(at, (int, float)) or not 0 < at <= now + 300:
                raise api_error(400, "bad_value", "at is unix seconds, not in the future", field=f"reads[{i}].at")
            rows.append((it["delivery_id"], kind, float(at)))
        assert self.api.store is not None
        new = await self.api.store.add_reads(rows, producer=reader_scope(request))
        return json_response({"received": len(rows), "recorded": new})

    @requires("records:read", query=("since", "until"))
    async def get_stats(self, request: web.Request) -> web.Response:
        since, until = _times(request)
        assert self.api.store is not None
        rows = await self.api.store.rates(since, until, producer=reader_scope(request))
        return json_response({"since": since, "until": until, "rows": rows})

    @requires("records:read", query=("user_id", "since", "limit"))
    async def get_unsubscribes(self, request: web.Request) -> web.Response:
        since = _times(request, default_s=30 * 86400.0)[0]
        limit = int_param(request, "limit", 100, 1, 1000)
        assert self.api.store is not None
        items = await self.api.store.unsubscribes(user_id=request.query.get("user_id") or None, since=since,
                                                  producer=reader_scope(request), limit=limit)
        return json_response({"items": items})
