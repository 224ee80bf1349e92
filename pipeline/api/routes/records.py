"""``GET /v1/notifications`` and ``GET /v1/notifications/{id}``: the record
store's rows as the API shows them, only the caller's producer's unless it
holds ``admin``."""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web

from pipeline.rules.states import RANK
from pipeline.parsers.events import MAX_ID

from ..auth import requires
from ..errors import api_error, json_response
from ..request import int_param, reader_scope
from . import Routes

__all__ = ["Records", "overall"]

_NID_RE = re.compile(r"^n_[0-9a-f]{20}$")
_DID_RE = re.compile(r"^n_[0-9a-f]{20}\.(inbox|push|sms|email|webhook)$")


def _record(row: dict[str, Any]) -> dict[str, Any]:
    """A record-store row as the API shows it (``state``, not the seed's ``status``)."""
    return {
        "delivery_id": row["delivery_id"],
        "notification_id": row["notification_id"],
        "biz_key": row["biz_key"],
        "user_id": row["user_id"],
        "channel": row["channel"],
        "category": row["category"],
        "template": row["template_code"],
        "priority": row["priority"],
        "state": row["status"],
        "reason": row["reason"],
        "provider": row["provider"],
        "provider_msg_id": row["provider_msg_id"],
        "retry_count": row["retry_count"],
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
        "sent_at": row["sent_at"],
        "delivered_at": row["delivered_at"],
        "accepted_at": row["accepted_at"],
        "latency_ms": row["latency_ms"],
        "producer": row["producer"],
        "pref_version": row["pref_version"],
        "template_version": row["template_version"],
    }


def overall(states: list[str]) -> str:
    """One state for a notification's channels: the highest in the record precedence."""
    return max(states, key=lambda s: RANK.get(s, -1)) if states else "PENDING"


class Records(Routes):
    def add_to(self, router: web.UrlDispatcher) -> None:
        router.add_get("/v1/notifications", self.list_notifications, allow_head=False)
        router.add_get("/v1/notifications/{id}", self.get_notification, allow_head=False)

    @requires("records:read")
    async def get_notification(self, request: web.Request) -> web.Response:
        store = self.api.store
        assert store is not None
        key = request.match_info["id"]
        if not (_NID_RE.match(key) or _DID_RE.match(key)):
            raise api_error(404, "not_found", "not a notification id (n_…) or delivery id (n_….<channel>)",
                            field="id")
        rows = await store.get(key)
        scope = reader_scope(request)
        if scope is not None:  # another producer's notification is not found, not forbidden
            rows = [r for r in rows if r["producer"] == scope]
        if not rows:
            raise api_error(404, "not_found", "no record for this id (an accepted notification appears once "
                            "the pipeline records its first state)", field="id")
        deliveries = []
        for row in rows:
            rec = _record(row)
            rec["attempts"] = await store.attempts(row["delivery_id"])
            deliveries.append(rec)
        first = rows[0]
        return json_response({
            "notification_id": first["notification_id"],
            "biz_key": first["biz_key"],
            "user_id": first["user_id"],
            "state": overall([r["status"] for r in rows]),
            "deliveries": deliveries,
        })

    @requires("records:read", query=("biz_key", "user_id", "limit", "cursor"))
    async def list_notifications(self, request: web.Request) -> web.Response:
        store = self.api.store
        assert store is not None
        biz_key = request.query.get("biz_key") or None
        user_id = request.query.get("user_id") or None
        if biz_key is not None and len(biz_key) > 64:
            raise api_error(400, "bad_value", "biz_key is at most 64 characters", field="biz_key")
        if user_id is not None and len(user_id) > MAX_ID:
            raise api_error(400, "bad_value", f"user_id is at most {MAX_ID} characters", field="user_id")
        limit = int_param(request, "limit", 50, 1, 1000)
        cursor = int_param(request, "cursor", None, 1, 2**62)
        rows, nxt = await store.find(biz_key=biz_key, user_id=user_id, limit=limit, cursor=cursor,
                                     producer=reader_scope(request))
        return json_response({"items": [_record(r) for r in rows], "next_cursor": nxt})
