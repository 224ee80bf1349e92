"""Webhook targets (SSRF): a real receiver listens on 127.0.0.1; the real adapter,
with the system resolver, refuses it in every spelling of a loopback, private or
unspecified address unless the allowlist names it, and the receiver's ledger
shows that no request was made. (The pipeline-level check, with the simulators'
loopback allowlist in place, is in test_stream_fuzz.py.)"""

from __future__ import annotations

import pytest

from adapters.simulators import SimProfile
from adapters.simulators.webhook_sim import WebhookSim
from adapters.webhook import WebhookConfig, WebhookProvider
from pipeline.models import AttemptResult, Delivery


@pytest.fixture
async def receiver():
    sim = WebhookSim(SimProfile.clean())
    await sim.start()
    yield sim
    await sim.stop()


def delivery(url: str, n: int) -> Delivery:
    return Delivery(delivery_id=f"n_{n:020d}.webhook", notification_id=f"n_{n:020d}", biz_key=f"wh:{n}", user_id="u1",
                    channel="webhook", category="transaction", template="t", priority="normal", address=url,
                    content={"body": '{"a": 1}'})


def spellings(port: int) -> list[str]:
    return [
        f"http://127.0.0.1:{port}/hook/ok",
        f"http://localhost:{port}/hook/ok",
        f"http://127.1:{port}/hook/ok",
        f"http://0x7f000001:{port}/hook/ok",
        f"http://2130706433:{port}/hook/ok",
        f"http://0177.0.0.1:{port}/hook/ok",
        f"http://[::ffff:127.0.0.1]:{port}/hook/ok",
        f"http://0.0.0.0:{port}/hook/ok",
        f"http://LOCALHOST.:{port}/hook/ok",
    ]


async def test_loopback_in_any_spelling_is_refused_without_a_call(receiver):
    p = WebhookProvider(WebhookConfig(secret=receiver.secret, timeout=2.0))
    try:
        for n, url in enumerate(spellings(receiver.port)):
            r = await p.send(delivery(url, n))
            assert r.result == AttemptResult.PERMANENT_ERROR and r.permanent_kind == "target_refused", (url, r)
    finally:
        await p.close()
    assert receiver.core.ledger_view() == []


async def test_the_allowlist_lets_exactly_what_it_names_through(receiver):
    p = WebhookProvider(WebhookConfig(secret=receiver.secret, allow=("127.0.0.1",), timeout=2.0))
    try:
        ok = await p.send(delivery(f"http://127.0.0.1:{receiver.port}/hook/ok", 100))
        assert ok.result == AttemptResult.ACCEPTED, ok
        # a v6 disguise of the same address is not what the allowlist names
        r = await p.send(delivery(f"http://[::ffff:127.0.0.1]:{receiver.port}/hook/ok", 101))
        assert r.permanent_kind == "target_refused"
        for url in ("http://10.0.0.1/hook", "http://169.254.169.254/latest/meta-data", "http://[fd00::1]/x"):
            r = await p.send(delivery(url, 102))
            assert r.permanent_kind == "target_refused", (url, r)
    finally:
        await p.close()
    assert [row["key"] for row in receiver.core.ledger_view()] == [f"n_{100:020d}.webhook"]
