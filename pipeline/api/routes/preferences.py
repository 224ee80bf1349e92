"""``GET`` and ``PUT /v1/users/{id}/preferences``.

``<ns>:api:prefs`` (hash user_id → Preferences JSON)
    The read model of ``GET /v1/users/{id}/preferences``: the last PUT accepted
    by the API, written (compare-and-set on the version) before the update is
    produced to ``notify.preferences`` (with ``source`` ``api`` and the key's
    producer). Updates that producers write straight to the topic are not
    reflected here; a one-click unsubscribe (routes/unsubscribe.py) turns its
    switch off here too when the user has a document.

Opt-outs are not recorded here: the users agent records every switch an update
turns off when it applies it (agents/users.py), whatever sent the update.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import orjson
from aiohttp import web

from pipeline import topics as T
from pipeline.models import Preferences as Prefs
from pipeline.parsers.events import InvalidEvent, parse_preferences

from ..auth import PRINCIPAL, requires
from ..errors import api_error
from ..request import coerce_integers, user_id
from . import Routes

__all__ = ["Preferences", "publish_preferences", "read_model_value", "message"]

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
        # where the update comes from is ours to say, and a PUT replaces the whole document
        body = {k: v for k, v in body.items() if k not in _MESSAGE_FIELDS}

        def build(_cur: dict | None, cur_v: int) -> Prefs:
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
            return prefs

        principal = request.get(PRINCIPAL)
        producer = principal.producer if principal is not None else ""
        prefs = await publish_preferences(self.api, uid, build,
                                          lambda p: message(p, source="api", producer=producer))
        assert prefs is not None
        # the opt-outs it makes are recorded where the update is applied (agents/users.py)
        return web.Response(body=read_model_value(prefs), status=202, content_type="application/json")


#: what a preferences message says about itself, never part of the read model
_MESSAGE_FIELDS = ("source", "producer", "merge")


def read_model_value(prefs: Prefs) -> bytes:
    """The read model's JSON of ``prefs`` (what GET answers): the document, without
    what the message says about where it comes from."""
    return orjson.dumps({k: v for k, v in prefs.asdict().items() if k not in _MESSAGE_FIELDS})


def message(prefs: Prefs, **fields) -> Prefs:
    """``prefs`` as the update produced to notify.preferences, with ``fields``
    (``source``, ``producer``, ``merge``) set."""
    return Prefs(**{**prefs.asdict(), **fields})


def _current(raw: bytes | None) -> tuple[dict | None, int]:
    if raw is None:
        return None, -1
    try:
        doc = orjson.loads(raw)
        return (doc if isinstance(doc, dict) else None), int(doc.get("version") or 0)
    except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
        return None, 0


async def publish_preferences(api: Any, uid: str, build: Callable[[dict | None, int], Prefs | None],
                              message_of: Callable[[Prefs | None], Prefs]) -> Prefs | None:
    """The one way a preferences update leaves the API (the PUT, the one-click
    unsubscribe link: routes/unsubscribe.py): ``build(current read-model document
    or None, its version or -1)`` gives the new document (None: the read model
    stays as it is), set in the read model by compare-and-set on its exact value
    (retried on a race); then ``message_of(new document)`` is produced to
    notify.preferences (keyed by user); if that fails the read model is put back.
    Returns the new document."""
    client, writer = api.client, api.writer
    assert writer is not None
    key = f"{api.ns}:api:prefs"
    for _ in range(8):
        cur = await client.hget(key, uid)
        prefs = build(*_current(cur))
        if prefs is None:
            value = None
            break
        value = read_model_value(prefs)
        if int(await client.eval(_PREFS_CAS, 1, key, uid, cur or b"", value)):
            break
    else:
        raise api_error(409, "conflict", "concurrent updates of these preferences; retry")
    try:
        await writer.send([(T.PREFERENCES, uid.encode(), message_of(prefs).dumps(), [])])
    except BaseException:
        if value is not None:  # put the read model back (only if nobody changed it since)
            try:
                await client.eval(_PREFS_CAS, 1, key, uid, value, cur or b"")
            except Exception:  # noqa: BLE001
                log.warning("could not restore the preferences read model of %s", uid, exc_info=True)
        raise
    return prefs
