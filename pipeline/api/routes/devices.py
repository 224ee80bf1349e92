"""``PUT`` and ``DELETE /v1/users/{id}/devices/{token}``: a push device added
or removed, produced to ``notify.devices``."""

from __future__ import annotations

import time

from aiohttp import web

from pipeline import topics as T
from pipeline.models import DeviceUpdate
from pipeline.parsers.events import PUSH_PLATFORMS, TOKEN_RE

from ..auth import requires
from ..errors import api_error, json_response
from ..request import user_id
from . import Routes

__all__ = ["Devices"]


def _token(request: web.Request) -> str:
    token = request.match_info["token"]
    if not TOKEN_RE.match(token):
        raise api_error(400, "bad_value", "a device token is 1..512 of A-Z a-z 0-9 : _ . -", field="token")
    return token


class Devices(Routes):
    def add_to(self, router: web.UrlDispatcher) -> None:
        router.add_put("/v1/users/{id}/devices/{token}", self.put_device)
        router.add_delete("/v1/users/{id}/devices/{token}", self.delete_device)

    async def _device(self, uid: str, token: str, platform: str, op: str) -> web.Response:
        writer = self.api.writer
        assert writer is not None
        upd = DeviceUpdate(user_id=uid, token=token, platform=platform, op=op, at=time.time())
        await writer.send([(T.DEVICES, uid.encode(), upd.dumps(), [])])
        return json_response({"user_id": uid, "token": token, "platform": platform, "op": op, "at": upd.at},
                             status=202)

    @requires("users:write")
    async def put_device(self, request: web.Request) -> web.Response:
        uid = user_id(request)
        token = _token(request)
        body = await self.json_body(request)
        if not isinstance(body, dict):
            raise api_error(400, "not_an_object", 'the body is {"platform": "apns"|"fcm"|"hms"}')
        platform = body.get("platform")
        if platform is None:
            raise api_error(400, "missing_field", "platform is required", field="platform")
        if platform not in PUSH_PLATFORMS:
            raise api_error(400, "bad_value", "platform is apns, fcm or hms", field="platform")
        return await self._device(uid, token, platform, "add")

    @requires("users:write", query=("platform",))
    async def delete_device(self, request: web.Request) -> web.Response:
        uid = user_id(request)
        token = _token(request)
        platform = request.query.get("platform", "apns")
        if platform not in PUSH_PLATFORMS:
            raise api_error(400, "bad_value", "platform is apns, fcm or hms", field="platform")
        return await self._device(uid, token, platform, "remove")
