"""A real HTTP server on 127.0.0.1 in a thread of its own (the test's stand-in for a
customer's webhook receiver): ``serve(routes)`` → its port."""

from __future__ import annotations

import asyncio
import threading

from aiohttp import web

from pipeline.embedded import free_port


def serve(*routes: web.RouteDef) -> int:
    """Start an aiohttp app with ``routes`` on a free port; it lives as long as the process."""
    port = free_port()
    loop = asyncio.new_event_loop()
    ready = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        app = web.Application()
        app.add_routes(routes)
        runner = web.AppRunner(app)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
        ready.set()
        loop.run_forever()

    threading.Thread(target=run, daemon=True).start()
    assert ready.wait(10), "the HTTP server did not start"
    return port
