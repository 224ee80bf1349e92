"""Fixtures for the adapter tests: one simulator per test (each starts in a few
milliseconds on an ephemeral 127.0.0.1 port) with the deterministic profile,
and a factory for deliveries."""

from __future__ import annotations

import asyncio
import itertools
import socket
import time
from typing import Any, Callable

import pytest
from aiohttp import web

from adapters.receipts import MemoryReplayGuard, ReceiptRejected, ReceiptVerifier
from adapters.simulators import SimProfile
from adapters.simulators.apns_sim import ApnsSim
from adapters.simulators.fcm_sim import FcmSim
from adapters.simulators.smtp_sim import SmtpSim
from adapters.simulators.twilio_sim import TwilioSim
from adapters.simulators.vendor_sim import VendorSim
from adapters.simulators.webhook_sim import WebhookSim
from pipeline.models import Delivery

_ids = itertools.count(1)

CHANNEL_OF = {"apns": "push", "fcm": "push", "sms": "sms", "email": "email", "webhook": "webhook", "inbox": "inbox"}


@pytest.fixture
def profile() -> SimProfile:
    return SimProfile.clean(hang_s=3.0)


@pytest.fixture
def make_delivery() -> Callable[..., Delivery]:
    def make(channel: str, address: str, content: dict[str, Any] | None = None, *, priority: str = "normal", **kw: Any) -> Delivery:
        n = next(_ids)
        did = kw.pop("delivery_id", f"n_test{n:06d}{int(time.time() * 1000) % 100000:05d}.{channel}")
        return Delivery(
            delivery_id=did,
            notification_id=did.rsplit(".", 1)[0],
            biz_key=f"test:{n}",
            user_id=f"u{n}",
            channel=channel,
            category="account",
            template="t",
            priority=priority,
            address=address,
            content=content if content is not None else {"title": "Hello", "body": "Your code is 123456"},
            **kw,
        )

    return make


@pytest.fixture
def free_port() -> int:
    """A port on 127.0.0.1 with nothing listening (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ReceiptCollector:
    """A stand-in for the pipeline's ``POST /v1/receipts/<provider>`` endpoint."""

    def __init__(self, verifier_factory: Callable[[], ReceiptVerifier | None]) -> None:
        self.verifier_factory = verifier_factory
        self.receipts: list[Any] = []
        self.rejected: list[str] = []
        self.raw: list[tuple[str, bytes, dict[str, str]]] = []
        self._runner: web.AppRunner | None = None
        self.port = 0
        self.event = asyncio.Event()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/receipts"

    async def _handle(self, request: web.Request) -> web.Response:
        provider = request.match_info["provider"]
        body = await request.read()
        self.raw.append((provider, body, dict(request.headers)))
        verifier = self.verifier_factory()
        if verifier is None:
            return web.Response(status=503)
        try:
            if provider == "twilio":
                r = await verifier.twilio_request(str(request.url), request.content_type, body, request.headers)
                got = [r] if r else []
            else:
                got = await verifier.vendor(body, request.headers.get("X-Vendor-Timestamp"), request.headers.get("X-Vendor-Signature"))
        except ReceiptRejected as exc:
            self.rejected.append(exc.reason)
            return web.json_response({"error": exc.reason}, status=403)
        self.receipts.extend(got)
        self.event.set()
        return web.json_response({"ok": True})

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


@pytest.fixture
async def collector():
    holder: dict[str, ReceiptVerifier] = {}
    c = ReceiptCollector(lambda: holder.get("v"))
    c.holder = holder  # type: ignore[attr-defined]
    await c.start()
    yield c
    await c.stop()


def _verifier_for(collector: ReceiptCollector, **kw: Any) -> None:
    holder = collector.holder  # type: ignore[attr-defined]
    holder.setdefault("kw", {}).update(kw)
    holder["v"] = ReceiptVerifier(guard=MemoryReplayGuard(), **holder["kw"])


@pytest.fixture
async def apns_sim(profile):
    sim = ApnsSim(profile)
    await sim.start()
    yield sim
    await sim.stop()


@pytest.fixture
async def fcm_sim(profile):
    sim = FcmSim(profile)
    await sim.start()
    yield sim
    await sim.stop()


@pytest.fixture
async def twilio_sim(profile, collector):
    sim = TwilioSim(profile, receipts_url=collector.base_url + "/twilio")
    await sim.start()
    _verifier_for(collector, twilio_auth_token=sim.auth_token)
    yield sim
    await sim.stop()


@pytest.fixture
async def vendor_sim(profile, collector):
    sim = VendorSim(profile, receipts_url=collector.base_url + "/smsvendor")
    await sim.start()
    _verifier_for(collector, vendor_secret=sim.webhook_secret)
    yield sim
    await sim.stop()


@pytest.fixture
async def smtp_sim(profile):
    sim = SmtpSim(profile)
    await sim.start()
    yield sim
    await sim.stop()


@pytest.fixture
async def webhook_sim(profile):
    sim = WebhookSim(profile)
    await sim.start()
    yield sim
    await sim.stop()
