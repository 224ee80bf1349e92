"""``GET`` and ``PUT /v1/users/{id}/preferences``.

``<ns>:api:prefs`` (hash user_id → Preferences JSON)
    The read model of ``GET /v1/users/{id}/preferences``: the last PUT accepted
    by the API, written (compare-and-set on the version) before the update is
    produced to ``notify.preferences``. Updates that producers write straight
    to the topic are not reflected here.
"""

from __future__ import annotations

import logging
import time

import orjson
from aiohttp import web

from pipeline import topics as T
from pipeline.parsers.events import InvalidEvent, parse_preferences
from pipeline.rules.tracking import switched_off

from ..auth import PRINCIPAL, requires
from ..errors import api_error
from ..request import coerce_integers, user_id
from . import Routes

__all__ = ["Preferences"]

log = logging.getLogger("notify.api")

_MAX_VERSION = 2**63 - 1

#: compare-and-set of one user's preferences in the read model: ARGV uid, the
#: exact value expected now ('' = none), the new value ('' = delete); 1 if done
_PREFS_CAS = """
if (redis.call('HGET', KEYS[1], ARGV[1]) or '') ~= ARGV[2] then return 0 end
if ARGV[3] == '' then redis.call('HDEL', KEYS[1], ARGV[1]) else redis.call('HSET', KEYS[1], ARGV[1], ARGV[3]) end
return 1
"""


class Preferences(Routes):
    def add_to(self, router: web.UrlDispatcher) -> None:
        router.add_get("/v1/users/{id}/preferences", self.get_preferences, allow_head=False)
        router.add_put("/v1/users/{id}/preferences", self.put_preferences)

    @property
    def prefs_key(self) -> str:
        return f"{self.api.ns}:api:prefs"

    @requires("users:read")
    async def get_preferences(self, request: web.Request) -> web.Response:
        uid = user_id(request)
        raw = await self.api.client.hget(self.prefs_key, uid)
        if raw is None:
            raise api_error(404, "not_found", "no preferences were set for this user through the API")
        return web.Response(body=raw, content_type="application/json")

    @requires("users:write")
    async def put_preferences(self, request: web.Request) -> web.Response:
        writer, client = self.api.writer, self.api.client
        assert writer is not None
        uid = user_id(request)
        body = await self.json_body(request)
        if not isinstance(body, dict):
            raise api_error(400, "not_an_object", "the preferences are a JSON object")
        coerce_integers(body, ("version", "v"))
        if body.get("user_id") is not None and str(body["user_id"]).strip() != uid:
            raise api_error(400, "bad_value", "user_id differs from the path", field="user_id")
        explicit = body.get("version")
        if isinstance(explicit, int) and not isinstance(explicit, bool) and explicit > _MAX_VERSION:
            raise api_error(400, "bad_value", f"version is at most {_MAX_VERSION}", field="version")
        for _ in range(8):
            cur = await client.hget(self.prefs_key, uid)
            cur_v = -1
            if cur is not None:
                try:
                    cur_v = int(orjson.loads(cur).get("version") or 0)
                except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
                    cur_v = 0
            doc = {**body, "user_id": uid, "version": explicit if explicit is not None else max(cur_v + 1, 1)}
            try:
                prefs = parse_preferences(doc, self.api.settings)
            except InvalidEvent as exc:
                raise api_error(400, exc.reason, str(exc), field=exc.field) from None
            if prefs.version > _MAX_VERSION:
                raise api_error(409, "stale_version", "the version is at its maximum", field="version",
                                current_version=cur_v)
            if prefs.version < cur_v:
                raise api_error(409, "stale_version", f"version {prefs.version} < current {cur_v}",
                                field="version", current_version=cur_v)
            value = prefs.dumps()
            if int(await client.eval(_PREFS_CAS, 1, self.prefs_key, uid, cur or b"", value)):
                break
        else:
            raise api_error(409, "conflict", "concurrent updates of these preferences; retry")
        try:
            await writer.send([(T.PREFERENCES, uid.encode(), value, [])])
        except BaseException:
            # put the read model back (only if nobody changed it since)
            try:
                await client.eval(_PREFS_CAS, 1, self.prefs_key, uid, value, cur or b"")
            except Exception:  # noqa: BLE001
                log.warning("could not restore the preferences read model of %s", uid, exc_info=True)
            raise
        await self._record_opt_outs(request, uid, cur, prefs)
        return web.Response(body=value, status=202, content_type="application/json")

    async def _record_opt_outs(self, request: web.Request, uid: str, cur: bytes | None, prefs) -> None:
        """Every switch this update turns off, as an unsubscribe (source ``api``)."""
        try:
            before = orjson.loads(cur).get("switches") if cur else None
        except (orjson.JSONDecodeError, AttributeError):
            before = None
        off = switched_off(before if isinstance(before, dict) else None, prefs.switches or {})
        if not off or self.api.store is None:
            return
        principal = request.get(PRINCIPAL)
        producer = principal.producer if principal is not None else ""
        now = time.time()
        try:
            await self.api.store.add_unsubscribes([(uid, c, ch, "api", now, producer) for c, ch in off])
        except Exception:  # noqa: BLE001 - the update itself is done
            log.warning("could not record the opt-outs of %s", uid, exc_info=True)
