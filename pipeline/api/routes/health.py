"""The open endpoints (no key): ``/`` (the status page), ``/healthz``,
``/metrics`` (Prometheus, with the consumer lag), ``/v1/openapi.json`` and
``/v1/status.json``."""

from __future__ import annotations

import asyncio

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from ..auth import OPEN, requires
from ..errors import error_body, json_response
from ..status import PAGE, status_document
from . import Routes

__all__ = ["Health"]


class Health(Routes):
    def add_to(self, router: web.UrlDispatcher) -> None:
        router.add_get("/", self.status_page, allow_head=False)
        router.add_get("/healthz", self.healthz, allow_head=False)
        router.add_get("/metrics", self.metrics, allow_head=False)
        router.add_get("/v1/openapi.json", self.openapi_json, allow_head=False)
        router.add_get("/v1/status.json", self.status_json, allow_head=False)

    @requires(OPEN)
    async def healthz(self, request: web.Request) -> web.Response:
        broker = store = False
        try:
            broker = bool(await asyncio.wait_for(self.api.client.ping(), 2.0))
        except Exception:  # noqa: BLE001
            pass
        try:
            assert self.api.store is not None
            await asyncio.wait_for(self.api.store.find(limit=1), 2.0)
            store = True
        except Exception:  # noqa: BLE001
            pass
        if broker and store:
            return json_response({"status": "ok", "broker": True, "store": True})
        return json_response(
            error_body("unhealthy", "a dependency is unavailable", broker=broker, store=store), status=503
        )

    @requires(OPEN)
    async def metrics(self, request: web.Request) -> web.Response:
        api = self.api
        assert api.sampler is not None
        await api.sampler.snapshot(force=True)  # every scrape reads Redis
        await api.scheduled.refresh()
        body = generate_latest(REGISTRY) + generate_latest(api.lag_registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    @requires(OPEN)
    async def status_page(self, request: web.Request) -> web.Response:
        return web.Response(text=PAGE, content_type="text/html", headers={"Cache-Control": "no-store"})

    @requires(OPEN)
    async def status_json(self, request: web.Request) -> web.Response:
        api = self.api
        doc = await status_document(api.sampler, api.store, api.client, api.rkeys, api.settings.backpressure.after_s)
        return json_response(doc, headers={"Cache-Control": "no-store"})

    @requires(OPEN)
    async def openapi_json(self, request: web.Request) -> web.Response:
        return json_response(self.api.openapi)
