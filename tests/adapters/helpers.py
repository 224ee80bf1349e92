"""What the adapter tests share besides conftest's fixtures: stand-ins for the
API's ``POST /v1/receipts/<name>`` (the SMS providers' signed callbacks:
:class:`ReceiptCollector`; the e-mail events, SendGrid's Event Webhook and SNS
messages of SES events: :class:`EmailReceiptCollector`) and the config file a
test writes (:func:`notify_toml`)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, Callable, Optional

from aiohttp import web

from adapters.receipts import MemoryReplayGuard, ReceiptRejected, ReceiptVerifier
from adapters.receipts_email import email_receipts


def notify_toml(tmp_path: Path, text: str) -> str:
    """``text`` written to ``<tmp_path>/notify.toml``; its path."""
    path = tmp_path / "notify.toml"
    path.write_text(text)
    return str(path)


class ReceiptServer:
    """``POST /v1/receipts/{provider}`` on 127.0.0.1: every request kept in ``raw``,
    verified by :meth:`verify` (its receipts kept, its refusal's reason noted), the
    status of every answer in ``answers``."""

    refusal_status = 403
    wake_on_refusal = False  #: whether a refusal ends a :meth:`wait_for` round too

    def __init__(self) -> None:
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

    async def verify(self, provider: str, request: web.Request, body: bytes) -> Optional[list[Any]]:
        """The receipts of one callback, or None when there is no verifier (503)."""
        raise NotImplementedError

    def refusal(self, exc: ReceiptRejected) -> dict[str, Any]:
        return {"error": exc.reason}

    def acknowledgement(self, got: list[Any]) -> dict[str, Any]:
        return {"ok": True}

    async def _handle(self, request: web.Request) -> web.Response:
        provider = request.match_info["provider"]
        body = await request.read()
        self.raw.append((provider, body, dict(request.headers)))
        try:
            got = await self.verify(provider, request, body)
        except ReceiptRejected as exc:
            self.rejected.append(exc.reason)
            return self._answer(self.refusal_status, self.refusal(exc), self.wake_on_refusal)
        if got is None:
            return self._answer(503, None, False)
        self.receipts.extend(got)
        return self._answer(200, self.acknowledgement(got), True)

    def _answer(self, status: int, doc: Optional[dict[str, Any]], wake: bool) -> web.Response:
        self.answers.append(status)
        if wake:
            self.event.set()
        return web.Response(status=status) if doc is None else web.json_response(doc, status=status)

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

    async def receipt_for(self, result: Any, timeout: float = 5.0) -> Any:
        """The first receipt of the message a send answered (``result.provider_msg_id``)."""
        return await self.wait_for(lambda x: x.provider_msg_id == result.provider_msg_id, timeout)

    async def send_one(self, provider: Any, delivery: Any) -> Any:
        """Send ``delivery`` through ``provider`` (closed after) and wait for its
        receipt; the send's result."""
        try:
            r = await provider.send(delivery)
            await self.receipt_for(r)
        finally:
            await provider.close()
        return r

    async def wait_until(self, pred: Callable[[], bool], timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out; rejected {self.rejected}, answers {self.answers}")
            await asyncio.sleep(0.02)


class ReceiptCollector(ReceiptServer):
    """The SMS providers' callbacks (Twilio, the JSON vendor), verified by the
    verifier ``verifier_factory()`` gives at the time (None: 503); a refusal is 403."""

    def __init__(self, verifier_factory: Callable[[], ReceiptVerifier | None]) -> None:
        super().__init__()
        self.verifier_factory = verifier_factory

    async def verify(self, provider: str, request: web.Request, body: bytes) -> Optional[list[Any]]:
        verifier = self.verifier_factory()
        if verifier is None:
            return None
        if provider == "twilio":
            r = await verifier.twilio_request(str(request.url), request.content_type, body, request.headers)
            return [r] if r else []
        return await verifier.vendor(body, request.headers.get("X-Vendor-Timestamp"),
                                     request.headers.get("X-Vendor-Signature"))


class EmailReceiptCollector(ReceiptServer):
    """``POST /v1/receipts/{sendgrid|ses}``: verified with ``verifier`` (one for the
    collector's life: its replay guard remembers; :meth:`configure` sets it); a
    refusal is 401 and ends a :meth:`wait_for` round."""

    refusal_status = 401
    wake_on_refusal = True

    def __init__(self) -> None:
        super().__init__()
        self.verifier: Optional[ReceiptVerifier] = None

    def configure(self, **kw: Any) -> ReceiptVerifier:
        self.verifier = ReceiptVerifier(guard=MemoryReplayGuard(), **kw)
        return self.verifier

    async def verify(self, provider: str, request: web.Request, body: bytes) -> Optional[list[Any]]:
        if self.verifier is None:
            return None
        return await email_receipts(self.verifier, provider, body, request.headers)

    def refusal(self, exc: ReceiptRejected) -> dict[str, Any]:
        return {"error": exc.reason, "detail": exc.detail}

    def acknowledgement(self, got: list[Any]) -> dict[str, Any]:
        return {"received": len(got)}
