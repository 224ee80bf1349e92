"""``POST /v1/events``: one event or a batch, validated, claimed under their
business keys (:mod:`..idempotency`), written to the event topics and confirmed;
a repeat answers with the original ids and their current states."""

from __future__ import annotations

import secrets
import time
from typing import Any, Optional

import orjson
from aiohttp import web

from pipeline import ids
from pipeline import topics as T
from pipeline.models import Event
from pipeline.rules.priority import PRIORITY_ANY_HEADER, PRIORITY_ANY_SCOPE, above_cap
from pipeline.parsers.events import InvalidEvent, check_params, parse_event

from .. import metrics_lag as M
from ..auth import PRINCIPAL, requires
from ..errors import api_error, error_body, json_response
from ..idempotency import Claim, Idempotency, fingerprint
from ..request import coerce_integers
from ..state import Api
from . import Routes
from .records import overall

__all__ = ["Events"]

#: statuses of refused events other than 400
_STATUS = {"oversized": 413, "missing_params": 422}


class Events(Routes):
    def __init__(self, api: Api) -> None:
        super().__init__(api)
        self.idempotency = Idempotency(api)

    def add_to(self, router: web.UrlDispatcher) -> None:
        router.add_post("/v1/events", self.post_events)

    def _parse_event(self, raw: bytes, priority_any: bool = False) -> Event:
        ev = self._parse_event_fields(raw, priority_any)
        check_params(ev, self.api.renderer)  # missing_params: 422, the variables named
        return ev

    def _parse_event_fields(self, raw: bytes, priority_any: bool = False) -> Event:
        # now: send_at is bounded both ways at the door; priority: capped by the
        # category unless the key holds priority:any
        settings, renderer = self.api.settings, self.api.renderer
        kw = {"now": time.time(), "priority_any": priority_any}
        try:
            return parse_event(raw, settings, renderer, **kw)
        except InvalidEvent as exc:
            if exc.reason != "wrong_type":
                raise
            try:
                data = orjson.loads(raw)
            except orjson.JSONDecodeError:
                raise exc from None
            if not coerce_integers(data, ("v", "template_version"), ("recipients",)):
                raise
            return parse_event(orjson.dumps(data), settings, renderer, **kw)

    @requires("events:write")
    async def post_events(self, request: web.Request) -> web.Response:
        raw = await self.read(request)
        principal = request.get(PRINCIPAL)
        priority_any = principal is not None and PRIORITY_ANY_SCOPE in principal.scopes
        head = raw.lstrip()[:1]
        batch = head == b"["
        if batch:
            try:
                items = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                raise api_error(400, "bad_json", str(exc)[:200]) from None
            if not items:
                raise api_error(400, "empty_batch", "the batch is empty")
            limit = self.api.batch_max_events
            if len(items) > limit:
                raise api_error(413, "batch_too_large", f"{len(items)} events > {limit} per request")
            events = []
            for i, item in enumerate(items):
                try:
                    events.append(self._parse_event(orjson.dumps(item), priority_any))
                except InvalidEvent as exc:
                    field = f"[{i}]" + (f".{exc.field}" if exc.field else "")
                    status = _STATUS.get(exc.reason, 400)
                    raise api_error(status, exc.reason, str(exc), field=field, index=i) from None
        else:
            try:
                events = [self._parse_event(raw, priority_any)]
            except InvalidEvent as exc:
                raise api_error(_STATUS.get(exc.reason, 400), exc.reason, str(exc), field=exc.field) from None
        results = await self._accept(events, principal.producer if principal else "")
        if not batch:
            r = results[0]
            if r["status"] == "accepted":
                return json_response(r, status=202)
            if r["status"] == "duplicate":
                return json_response(r, status=200)
            headers = {"Retry-After": "1"} if r["status"] == "in_progress" else None
            return json_response({"error": r.pop("error"), **r}, status=409, headers=headers)
        statuses = {r["status"] for r in results}
        code = 202 if "accepted" in statuses else 200 if statuses == {"duplicate"} else 409
        return json_response({"results": results}, status=code)

    async def _accept(self, events: list[Event], producer: str) -> list[dict[str, Any]]:
        """Claim, write and confirm (see :mod:`..idempotency`); one result per event."""
        writer, settings = self.api.writer, self.api.settings
        assert writer is not None
        now = time.time()
        results: list[Optional[dict[str, Any]]] = [None] * len(events)
        first: dict[str, int] = {}  # biz_key → index of its first event in this request
        claims: dict[int, Claim] = {}
        prepared: dict[int, tuple[Event, str]] = {}
        for i, ev in enumerate(events):
            # the caller's key space: a producer field in the body is replaced
            ev = Event(**{**ev.asdict(), "accepted_at": now, "producer": producer})
            fp = fingerprint(ev)
            prepared[i] = (ev, fp)
            if ev.biz_key in first:
                continue
            first[ev.biz_key] = i
            rec = {"fp": fp, "at": now, "st": "claim", "recipients": ev.recipients, "token": secrets.token_hex(8)}
            claims[i] = (self.idempotency.key(ev.biz_key, producer), orjson.dumps(rec), rec)

        ours, existing = await self.idempotency.claim(claims)

        # write the claimed events: one pipeline round trip for the whole request
        if ours:
            hdr = [("producer", producer.encode())] if producer else []
            # OTPs on notify.events.high: they never wait behind a campaign in notify.events
            # an event above its category's priority cap (only a priority:any key gets one
            # through) carries the mark that lets expand keep it (pipeline/rules/priority.py)
            msgs = [(T.event_topic(settings, ev.category, ev.priority), T.event_key(ev.biz_key, ev.recipients),
                     ev.dumps(),
                     hdr + [PRIORITY_ANY_HEADER] if above_cap(settings.category(ev.category), ev.priority)
                     else hdr)
                    for ev in (prepared[i][0] for i in ours)]
            try:
                await writer.send(msgs)
            except BaseException:
                await self.idempotency.release([claims[i] for i in ours])
                raise
            # the events are in the stream: accepted, whatever happens next
            await self.idempotency.confirm([claims[i] for i in ours])
            M.events_accepted.inc(len(ours))
            for i in ours:
                ev = prepared[i][0]
                results[i] = {
                    "status": "accepted",
                    "biz_key": ev.biz_key,
                    "accepted_at": now,
                    "notifications": [
                        {"user_id": u, "notification_id": ids.notification_id(ev.biz_key, u, producer)}
                        for u in ev.recipients
                    ],
                }

        # repeats: of an earlier request (existing) or of an event earlier in this one
        for i, (ev, fp) in prepared.items():
            if results[i] is not None:
                continue
            j = first[ev.biz_key]
            rec: Optional[dict[str, Any]] = existing.get(j)
            done = results[j]
            if j != i and done is not None and done["status"] == "accepted":
                rec = {"fp": prepared[j][1], "at": now, "st": "ok", "recipients": prepared[j][0].recipients}
            results[i] = await self._repeat(ev, fp, rec)
        for i, (ev, _fp) in prepared.items():
            res = results[i]
            if res is not None and res["status"] in ("accepted", "duplicate"):
                # the lane the event runs on: its own priority, capped by its category, else the category's
                res["priority"] = ev.priority or settings.category(ev.category).priority
        return results  # type: ignore[return-value]

    async def _repeat(self, ev: Event, fp: str, rec: Optional[dict[str, Any]]) -> dict[str, Any]:
        if rec is None or rec.get("st") != "ok":
            return {
                "status": "in_progress",
                "biz_key": ev.biz_key,
                "error": error_body("in_progress", "an earlier request with this biz_key is still being written; "
                                    "retry in a second", field="biz_key")["error"],
            }
        if rec.get("fp") != fp:
            return {
                "status": "conflict",
                "biz_key": ev.biz_key,
                "accepted_at": rec.get("at"),
                "error": error_body("biz_key_conflict", "this biz_key was accepted with different content; "
                                    "nothing was written", field="biz_key")["error"],
            }
        M.events_duplicate.inc()
        return {
            "status": "duplicate",
            "biz_key": ev.biz_key,
            "accepted_at": rec.get("at"),
            "notifications": await self._states(ev.biz_key, list(rec.get("recipients") or ev.recipients),
                                                ev.producer),
        }

    async def _all_records(self, biz_key: str, producer: str) -> list[dict[str, Any]]:
        store = self.api.store
        assert store is not None
        rows: list[dict[str, Any]] = []
        cursor = None
        while True:
            page, cursor = await store.find(biz_key=biz_key, limit=1000, cursor=cursor, producer=producer)
            rows.extend(page)
            if cursor is None:
                return rows

    async def _states(self, biz_key: str, recipients: list[str], producer: str) -> list[dict[str, Any]]:
        """The original ids of a biz_key with their current states (PENDING if not recorded yet)."""
        by_nid: dict[str, list[dict[str, Any]]] = {}
        for row in await self._all_records(biz_key, producer):
            by_nid.setdefault(row["notification_id"], []).append(row)
        out = []
        for user in recipients:
            nid = ids.notification_id(biz_key, user, producer)
            rows = sorted(by_nid.get(nid, []), key=lambda r: r["channel"])
            out.append({
                "user_id": user,
                "notification_id": nid,
                "state": overall([r["status"] for r in rows]),
                "channels": [
                    {"channel": r["channel"], "delivery_id": r["delivery_id"], "state": r["status"],
                     "reason": r["reason"]}
                    for r in rows
                ],
            })
        return out
