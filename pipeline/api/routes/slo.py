"""``GET /v1/slo``: seed 001's service level over the caller's events
(:mod:`pipeline.rules.slo`)."""

from __future__ import annotations

import time

from aiohttp import web

from pipeline.rules import slo

from ..auth import requires
from ..errors import api_error, json_response
from ..request import reader_scope
from . import Routes

__all__ = ["Slo"]


class Slo(Routes):
    def add_to(self, router: web.UrlDispatcher) -> None:
        router.add_get("/v1/slo", self.get_slo, allow_head=False)

    @requires("records:read", query=("since", "until", "month"))
    async def get_slo(self, request: web.Request) -> web.Response:
        """Seed 001's service level over the caller's events (every producer's
        with ``admin``): ``month=YYYY-MM`` (default: this month, UTC), or
        ``since``/``until`` (unix seconds or ISO 8601)."""
        store = self.api.store
        assert store is not None
        now = time.time()
        q = request.query
        field = "month"
        try:
            since, until = slo.month_range(q.get("month"), now)
            if "since" in q or "until" in q:
                field = "since"
                since = slo.parse_time(q["since"]) if "since" in q else since
                field = "until"
                until = slo.parse_time(q["until"]) if "until" in q else now
        except ValueError as exc:
            raise api_error(400, "bad_value", str(exc), field=field) from None
        if until <= since:
            raise api_error(400, "bad_value", "until must be after since", field="until")
        rows = await store.slo_events(since, until, producer=reader_scope(request))
        return json_response(slo.summarize(rows, since, until, now))
