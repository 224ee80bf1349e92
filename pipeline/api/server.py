"""The API's HTTP server: aiohttp's, with the door's limits (``[api]`` settings).

* **Header deadline.** A client has ``header_timeout_s`` (10 s) from connecting,
  or from its last answer on a kept-alive connection, to send a whole request
  line and headers; then the connection is closed (aiohttp's keep-alive timer,
  which also runs while a request's headers are incomplete). So is an idle
  kept-alive connection.
* **Body deadline.** A handler reads the body within ``body_timeout_s`` (30 s;
  ``Api._read``): 408 ``body_timeout`` and the connection closed after at most
  ``min(10, body_timeout_s)`` more seconds of draining (aiohttp's lingering).
* **Malformed requests** (a bad request line, a header with a control character,
  a folded or oversized header, ...) are refused by aiohttp's parser before any
  handler runs. Here they get the API's JSON error shape, without the parser's
  message (it quotes the offending header line: an API key in ``Authorization``)
  and without a traceback in the log: one line naming the client and the kind
  of error.

``notify api`` and ``notify run`` serve the API through :func:`run`; tests and
benchmarks start the same server with :func:`start`.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any, Callable, Optional

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMethod
from aiohttp.web_protocol import RequestHandler

from .errors import CODES, error_body, json_response

__all__ = ["ApiRequestHandler", "ApiRunner", "server_options", "start", "run"]

log = logging.getLogger("notify.api")

_MESSAGES = {
    400: "malformed HTTP request (request line or headers)",
    408: "the request did not arrive in time",
    413: "request too large",
    431: "request header fields too large",
}


class ApiRequestHandler(RequestHandler):
    """aiohttp's connection handler, answering what never reaches the application
    (the parser's refusals) in the API's JSON shape, without echoing the request."""

    def log_exception(self, *args: Any, **kw: Any) -> None:
        exc = kw.get("exc_info")
        if isinstance(exc, (web.RequestPayloadError, ConnectionResetError)):
            # the rest of a refused body that cannot be read (not its Content-Encoding, the
            # client gone) while draining it after the answer: the client's fault, one line
            log.info("dropped the unreadable rest of a request body: %s", type(exc).__name__)
            return
        super().log_exception(*args, **kw)

    def handle_error(self, request: Any, status: int = 500, exc: Optional[BaseException] = None,
                     message: Optional[str] = None) -> web.StreamResponse:
        kind = type(exc).__name__ if exc is not None else "error"
        if status >= 500:
            # a failure outside the application's own error handling: worth a traceback
            log.error("error handling a request from %s (%s)", request.remote, kind, exc_info=exc)
        elif self._request_count == 1 and isinstance(exc, BadHttpMethod):
            log.debug("not HTTP from %s (%s)", request.remote, kind)  # TLS or a scanner on the port
        else:
            # the client's fault: one line, never the parser's message (it quotes the header)
            log.warning("refused a malformed HTTP request from %s: %d %s", request.remote, status, kind)
        if request.writer.output_size > 0:
            raise ConnectionError("Response is sent already, cannot send another response with the error message")
        resp = json_response(error_body(CODES.get(status, "bad_request"), _MESSAGES.get(status, "request refused")),
                             status=status)
        resp.force_close()
        return resp


class _ApiServer(web.Server):
    def __call__(self) -> RequestHandler:
        return ApiRequestHandler(self, loop=self._loop, **self._kwargs)


class ApiRunner(web.AppRunner):
    """An :class:`aiohttp.web.AppRunner` whose connections are handled by
    :class:`ApiRequestHandler`."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        if type(server) is web.Server:  # noqa: E721 - exactly aiohttp's: same layout, our handler
            server.__class__ = _ApiServer
        return server


def server_options(settings: Any = None) -> dict[str, Any]:
    """The runner's options for ``settings.api`` (defaults without settings)."""
    api = getattr(settings, "api", None)
    header_timeout = float(getattr(api, "header_timeout_s", 10.0))
    body_timeout = float(getattr(api, "body_timeout_s", 30.0))
    return {
        "keepalive_timeout": header_timeout,
        "lingering_time": min(10.0, body_timeout),
        "access_log": None,
    }


#: pending connections the listening socket holds (the kernel caps it at
#: net.core.somaxconn): a burst of thousands of clients connecting at once waits in
#: it instead of being refused (aiohttp's default is 128)
BACKLOG = 1024


async def start(app: web.Application, host: str, port: int, *, settings: Any = None, backlog: int = BACKLOG,
                **runner_kwargs: Any) -> ApiRunner:
    """Serve ``app`` on ``host:port`` (0: any free port; ``runner.addresses`` says
    which) with the door's limits; ``await runner.cleanup()`` stops it."""
    runner = ApiRunner(app, **{**server_options(settings), **runner_kwargs})
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=backlog)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner


def run(app: web.Application, host: str, port: int, *, settings: Any = None,
        on_ready: Optional[Callable[[], None]] = None, shutdown_timeout: float = 60.0) -> None:
    """Serve until SIGINT / SIGTERM (what ``web.run_app`` did, with :func:`start`)."""

    async def main() -> None:
        runner = await start(app, host, port, settings=settings, shutdown_timeout=shutdown_timeout)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, stop.set)
            except (NotImplementedError, RuntimeError):  # pragma: no cover - not on a Unix main thread
                pass
        if on_ready is not None:
            on_ready()
        try:
            await stop.wait()
        finally:
            await runner.cleanup()

    asyncio.run(main())
