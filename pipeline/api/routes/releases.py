"""``GET /v1/releases``, ``PUT`` and ``DELETE /v1/releases/{name}``: gray
releases (:mod:`pipeline.rules.release`), the config's and those set through
the API (``<ns>:releases``, hash name → release JSON)."""

from __future__ import annotations

import re
from typing import Any

import orjson
from aiohttp import web

from config.settings import CHANNELS
from pipeline.rules import release

from ..auth import requires
from ..errors import api_error, json_response
from . import Routes

__all__ = ["Releases"]

_RELEASE_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")


class Releases(Routes):
    def add_to(self, router: web.UrlDispatcher) -> None:
        router.add_get("/v1/releases", self.list_releases, allow_head=False)
        router.add_put("/v1/releases/{name}", self.put_release)
        router.add_delete("/v1/releases/{name}", self.delete_release)

    async def _releases(self) -> list[dict[str, Any]]:
        raw = await self.api.client.hgetall(self.api.rkeys.releases)
        out = {r.name: {**r.as_dict(), "source": "config"} for r in self.api.settings.releases}
        for k, v in raw.items():
            name = k.decode() if isinstance(k, bytes) else str(k)
            try:
                out[name] = {**release.parse_release(name, orjson.loads(v), CHANNELS).as_dict(), "source": "api"}
            except (ValueError, orjson.JSONDecodeError, TypeError):
                continue
        return [out[n] for n in sorted(out)]

    @requires("admin")
    async def list_releases(self, request: web.Request) -> web.Response:
        return json_response({"items": await self._releases()})

    @requires("admin")
    async def put_release(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if not _RELEASE_RE.fullmatch(name):
            raise api_error(400, "bad_value", "release names are a-z, 0-9, _ and -, up to 64", field="name")
        body = await self.json_body(request)
        try:
            r = release.parse_release(name, body, CHANNELS)
        except ValueError as exc:
            field = str(exc).split(":", 1)[0].removeprefix(f"releases.{name}").lstrip(".") or None
            raise api_error(400, "bad_value", str(exc).split(": ", 1)[-1], field=field) from None
        if r.template is not None and not self.api.renderer.has_template(r.template, r.version):
            raise api_error(400, "unknown_template", f"no template {r.template} v{r.version}", field="version")
        await self.api.client.hset(self.api.rkeys.releases, name, orjson.dumps(r.as_dict()))
        return json_response({**r.as_dict(), "source": "api"})

    @requires("admin")
    async def delete_release(self, request: web.Request) -> web.Response:
        removed = await self.api.client.hdel(self.api.rkeys.releases, request.match_info["name"])
        if not removed:
            raise api_error(404, "not_found", "no release of that name was set through the API", field="name")
        return json_response({"deleted": request.match_info["name"]})
