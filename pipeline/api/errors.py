"""One JSON error shape for every answer that is not a success.

    {"error": {"code": "<machine word>", "message": "<human text>", "field": "<dotted field>"}}

``field`` is present when one input field is to blame (validation errors use
the reasons of :mod:`pipeline.parsers.events`: ``missing_field``,
``wrong_type``, ``unknown_category``, …). Handlers raise :func:`api_error`;
:func:`error_middleware` turns aiohttp's own exceptions (404, 405, 413 from
``client_max_size``) and anything unexpected (500, without internals) into the
same shape, and storage/broker outages into 503 with ``Retry-After``.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

import orjson
from aiohttp import web

from pipeline.store import StoreUnavailable

__all__ = ["ApiError", "api_error", "error_body", "error_middleware", "json_response", "CODES"]

log = logging.getLogger("notify.api")

#: the code used when an HTTP status is raised without one of ours
CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    409: "conflict",
    413: "too_large",
    415: "unsupported_media_type",
    429: "rate_limited",
    431: "headers_too_large",
    500: "internal",
    503: "unavailable",
}


def _dumps(obj: Any) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS)


def json_response(data: Any, status: int = 200, headers: Optional[dict[str, str]] = None) -> web.Response:
    return web.Response(body=_dumps(data), status=status, content_type="application/json", headers=headers)


def error_body(code: str, message: str, field: Optional[str] = None, **extra: Any) -> dict[str, Any]:
    err: dict[str, Any] = {"code": code, "message": message}
    if field is not None:
        err["field"] = field
    err.update({k: v for k, v in extra.items() if v is not None})
    return {"error": err}


class ApiError(web.HTTPException):
    """An HTTP error whose body is already our JSON shape."""

    def __init__(self, status: int, code: str, message: str, field: Optional[str] = None,
                 headers: Optional[dict[str, str]] = None, **extra: Any) -> None:
        self.status_code = status
        super().__init__(
            headers=headers, text=_dumps(error_body(code, message, field, **extra)).decode(),
            content_type="application/json",
        )
        self.code = code


def api_error(status: int, code: str, message: str, field: Optional[str] = None, **kw: Any) -> ApiError:
    return ApiError(status, code, message, field, **kw)


def _from_http(exc: web.HTTPException) -> web.Response:
    status = exc.status
    code = CODES.get(status, "error")
    message = exc.reason or code
    if status == 413:
        message = "request body too large"
    elif status == 405:
        message = f"method not allowed (allowed: {exc.headers.get('Allow', '')})"
    elif status == 404:
        message = "no such resource"
    headers = {k: v for k, v in exc.headers.items() if k.lower() in ("allow", "retry-after", "www-authenticate")}
    return json_response(error_body(code, message), status=status, headers=headers)


@web.middleware
async def error_middleware(request: web.Request, handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError:
        raise
    except web.HTTPException as exc:
        if exc.status < 400 or exc.content_type == "application/json":
            raise
        return _from_http(exc)
    except web.RequestPayloadError:
        # a body that does not decode as its Content-Encoding / Transfer-Encoding say:
        # the client's fault, a 400 without a traceback (handlers read through Api._read)
        resp = json_response(error_body("bad_body", "the body could not be read as its Content-Encoding and "
                                        "Transfer-Encoding say"), status=400)
        resp.force_close()
        return resp
    except StoreUnavailable as exc:
        log.warning("record store unavailable: %s", exc)
        return json_response(
            error_body("store_unavailable", "the record store is unavailable; retry later"),
            status=503, headers={"Retry-After": "1"},
        )
    except Exception as exc:  # noqa: BLE001
        from pipeline.transport.client import TRANSIENT_ERRORS

        if isinstance(exc, TRANSIENT_ERRORS) and "No connection available" in str(exc):
            # every broker connection of the API's pool stayed busy for its timeout:
            # ingest is over capacity, not down (redis-py's BlockingConnectionPool)
            log.warning("over capacity: no broker connection free within the pool timeout")
            return json_response(
                error_body("over_capacity", "too many requests in flight; retry later"),
                status=429, headers={"Retry-After": "1"},
            )
        if isinstance(exc, TRANSIENT_ERRORS):
            log.warning("broker unavailable: %r", exc)
            return json_response(
                error_body("broker_unavailable", "the broker is unavailable; retry later"),
                status=503, headers={"Retry-After": "1"},
            )
        log.exception("unhandled error in %s %s", request.method, request.path)
        return json_response(error_body("internal", "internal error"), status=500)
