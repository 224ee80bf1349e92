"""The API's routes, one module per resource. Each module holds a :class:`Routes`
class over the shared state (:class:`pipeline.api.state.Api`) whose ``add_to``
registers its routes; :func:`pipeline.api.app.make_app` calls them in order."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..request import json_body, read_body
from ..state import Api

__all__ = ["Routes"]


class Routes:
    def __init__(self, api: Api) -> None:
        self.api = api

    def add_to(self, router: web.UrlDispatcher) -> None:
        raise NotImplementedError

    async def read(self, request: web.Request) -> bytes:
        """The body, within ``[api] body_timeout_s`` (:func:`..request.read_body`)."""
        return await read_body(request, self.api.body_timeout)

    async def json_body(self, request: web.Request, *, optional: bool = False) -> Any:
        return await json_body(request, self.api.body_timeout, optional=optional)
