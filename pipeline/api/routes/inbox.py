"""``GET /v1/users/{id}/inbox`` and ``POST /v1/users/{id}/inbox/read``: a
user's in-app inbox in the record store."""

from __future__ import annotations

from aiohttp import web

from ..auth import requires
from ..errors import api_error, json_response
from ..request import int_param, user_id
from . import Routes

__all__ = ["Inbox"]


class Inbox(Routes):
    def add_to(self, router: web.UrlDispatcher) -> None:
        router.add_get("/v1/users/{id}/inbox", self.get_inbox, allow_head=False)
        router.add_post("/v1/users/{id}/inbox/read", self.post_inbox_read)

    @requires("users:read", query=("limit", "before"))
    async def get_inbox(self, request: web.Request) -> web.Response:
        store = self.api.store
        assert store is not None
        uid = user_id(request)
        limit = int_param(request, "limit", 50, 1, 200)
        before = int_param(request, "before", None, 1, 2**62)
        items, unread = await store.inbox(uid, limit=limit, before=before)
        nxt = items[-1]["id"] if len(items) == limit else None
        return json_response({"user_id": uid, "unread": unread, "items": items, "next_before": nxt})

    @requires("users:write")
    async def post_inbox_read(self, request: web.Request) -> web.Response:
        store = self.api.store
        assert store is not None
        uid = user_id(request)
        body = await self.json_body(request)
        if not isinstance(body, dict):
            raise api_error(400, "not_an_object", 'the body is {"delivery_ids": [...]} or {"all": true}')
        dids = body.get("delivery_ids")
        if "all" in body and not isinstance(body["all"], bool):
            raise api_error(400, "wrong_type", "true or false", field="all")
        if "delivery_ids" in body:
            if not isinstance(dids, list) or not all(isinstance(d, str) for d in dids):
                raise api_error(400, "wrong_type", "a list of delivery ids", field="delivery_ids")
            if len(dids) > 1000:
                raise api_error(400, "bad_value", "at most 1000 ids at once", field="delivery_ids")
            marked = await store.mark_read(uid, dids)
        elif body.get("all") is True:
            marked = await store.mark_read(uid, None)
        else:
            raise api_error(400, "missing_field", 'send {"delivery_ids": [...]} or {"all": true}',
                            field="delivery_ids")
        _items, unread = await store.inbox(uid, limit=0)
        return json_response({"user_id": uid, "marked": marked, "unread": unread})
