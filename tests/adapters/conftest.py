"""Fixtures for the adapter tests: one simulator per test (each starts in a few
milliseconds on an ephemeral 127.0.0.1 port) with the deterministic profile,
a factory for deliveries, and the receipts endpoints (``collector`` for SMS,
``email_collector``: :mod:`tests.adapters.helpers`)."""

from __future__ import annotations

import itertools
import time
from typing import Any, Callable

import pytest

from adapters.receipts import MemoryReplayGuard, ReceiptVerifier
from adapters.simulators import SimProfile
from adapters.simulators.apns_sim import ApnsSim
from adapters.simulators.fcm_sim import FcmSim
from adapters.simulators.smtp_sim import SmtpSim
from adapters.simulators.twilio_sim import TwilioSim
from adapters.simulators.vendor_sim import VendorSim
from adapters.simulators.webhook_sim import WebhookSim
from pipeline import embedded
from pipeline.models import Delivery
from tests.adapters.helpers import EmailReceiptCollector, ReceiptCollector

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
    return embedded.free_port()


@pytest.fixture
async def collector():
    holder: dict[str, ReceiptVerifier] = {}
    c = ReceiptCollector(lambda: holder.get("v"))
    c.holder = holder  # type: ignore[attr-defined]
    await c.start()
    yield c
    await c.stop()


@pytest.fixture
async def email_collector():
    """The e-mail events' endpoint (SendGrid, SES through SNS): a test configures its verifier."""
    c = EmailReceiptCollector()
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
