"""What the SendGrid, SES and SNS adapter tests share: a stand-in for the API's
``POST /v1/receipts/<name>`` that verifies e-mail events with a ReceiptVerifier
(SendGrid's Event Webhook, SNS messages of SES events), and providers wired to
the simulators."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Optional

from aiohttp import web

from adapters.receipts import MemoryReplayGuard, ReceiptRejected, ReceiptVerifier
from adapters.receipts_email import email_receipts


class EmailReceiptCollector:
    """``POST /v1/receipts/{sendgrid|ses}``: verified with ``verifier`` (one for the
    collector's life: its replay guard remembers), receipts kept, refusals noted."""

    def __init__(self) -> None:
        self.verifier: Optional[ReceiptVerifier] = None
        self.receipts: list[Any] = []
        self.rejected: list[str] = []
        self.raw: list[tuple[str, bytes, dict[str, str]]] = []
        self.answers: list[int] = []
        self._runner: Optional[web.AppRunner] = None
        self.port = 0
        self.event = asyncio.Event()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/receipts"

    def configure(self, **kw: Any) -> ReceiptVerifier:
        self.verifier = ReceiptVerifier(guard=MemoryReplayGuard(), **kw)
        return self.verifier

    async def _handle(self, request: web.Request) -> web.Response:
        scheme = request.match_info["provider"]
        body = await request.read()
        self.raw.append((scheme, body, dict(request.headers)))
        if self.verifier is None:
            self.answers.append(503)
            return web.Response(status=503)
        try:
            got = await email_receipts(self.verifier, scheme, body, request.headers)
        except ReceiptRejected as exc:
            self.rejected.append(exc.reason)
            self.answers.append(401)
            self.event.set()
            return web.json_response({"error": exc.reason, "detail": exc.detail}, status=401)
        self.receipts.extend(got)
        self.answers.append(200)
        self.event.set()
        return web.json_response({"received": len(got)})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/receipts/{provider}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner:
            await self._runner.cleanup()

    async def wait_for(self, pred: Callable[[Any], bool], timeout: float = 5.0) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for r in self.receipts:
                if pred(r):
                    return r
            self.event.clear()
            try:
                await asyncio.wait_for(self.event.wait(), max(0.01, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                pass
        raise AssertionError(f"no matching receipt within {timeout}s; got {self.receipts}, rejected {self.rejected}")

    async def wait_until(self, pred: Callable[[], bool], timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out; rejected {self.rejected}, answers {self.answers}")
            await asyncio.sleep(0.02)
