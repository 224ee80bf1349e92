"""Reading a request: its body (within the body deadline), JSON, the path's user
id, integer query parameters, whose records the caller may read, and JSON's
integral floats turned into ints. Shared by the route modules (:mod:`.routes`)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Optional

import orjson
from aiohttp import web

from pipeline.parsers.events import MAX_ID, id_problem

from .auth import PRINCIPAL
from .errors import api_error

__all__ = ["read_body", "json_body", "user_id", "int_param", "reader_scope", "coerce_integers"]

log = logging.getLogger("notify.api")


async def read_body(request: web.Request, timeout: float) -> bytes:
    """The request's body, within ``timeout`` (``[api] body_timeout_s``; 408 and
    the connection closed after it: a client holding a half-sent body holds
    nothing longer); a body that does not decode as its Content-Encoding says
    is a 400, not a 500 with a traceback."""
    try:
        async with asyncio.timeout(timeout):
            return await request.read()
    except TimeoutError:
        err = api_error(408, "body_timeout", f"the body did not arrive within {timeout:g} s")
        err.force_close()
        raise err from None
    except web.RequestPayloadError:
        # e.g. "Content-Encoding: gzip" over a body that is not gzip
        err = api_error(400, "bad_body", "the body could not be read as its Content-Encoding and "
                        "Transfer-Encoding say (nothing was taken)")
        err.force_close()
        raise err from None
    except ConnectionResetError:
        # the client left mid-body: nobody reads an answer, nothing to log but a line
        log.debug("client left before sending its body: %s %s", request.method, request.path)
        err = api_error(400, "bad_body", "the connection closed before the body arrived")
        err.force_close()
        raise err from None


async def json_body(request: web.Request, timeout: float, *, optional: bool = False) -> Any:
    raw = await read_body(request, timeout)
    if not raw.strip():
        if optional:
            return None
        raise api_error(400, "bad_json", "a JSON body is required")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise api_error(400, "bad_json", str(exc)[:200]) from None


def user_id(request: web.Request) -> str:
    raw = request.match_info["id"]
    uid = raw.strip()
    if not uid or len(uid) > MAX_ID:
        raise api_error(400, "bad_value", f"user ids are 1..{MAX_ID} characters", field="id")
    problem = id_problem(raw)
    if problem is not None:
        raise api_error(400, "bad_value", f"no control, format or separator characters in a user id: "
                        f"{problem}", field="id")
    return uid


def int_param(request: web.Request, name: str, default: Optional[int], lo: int, hi: int) -> Optional[int]:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise api_error(400, "wrong_type", f"{name} must be an integer", field=name) from None
    if not lo <= value <= hi:
        raise api_error(400, "bad_value", f"{name} must be in {lo}..{hi}", field=name)
    return value


def reader_scope(request: web.Request) -> Optional[str]:
    """Whose records the caller may read: its own producer's, or every
    producer's (None) with the ``admin`` scope."""
    principal = request.get(PRINCIPAL)
    if principal is None or "admin" in principal.scopes:
        return None
    return principal.producer


def _integral(value: Any) -> Any:
    """``409.0`` → ``409``: JSON does not tell 1 from 1.0 (nor does JSON Schema's
    ``integer``); the validators want Python ints."""
    if isinstance(value, float) and value.is_integer() and -(2**63) <= value < 2**63:
        return int(value)
    return value


def coerce_integers(data: Any, fields: tuple[str, ...], list_fields: tuple[str, ...] = ()) -> bool:
    """Turn integral floats into ints in ``data``'s top-level ``fields`` and in
    the items of ``list_fields``; True if anything changed."""
    if not isinstance(data, dict):
        return False
    changed = False
    for f in fields:
        if f in data and _integral(data[f]) is not data[f]:
            data[f] = _integral(data[f])
            changed = True
    for f in list_fields:
        items = data.get(f)
        if isinstance(items, list):
            new = [_integral(x) for x in items]
            if any(a is not b for a, b in zip(new, items)):
                data[f] = new
                changed = True
    return changed
