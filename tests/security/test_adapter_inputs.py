"""Deliveries that pass the lane's checks (pipeline/parsers/messages.py) but carry
hostile content still never make a real adapter raise (a raise would crash the
lane agent): each send against the protocol simulators answers a SendResult,
and header injection through an e-mail subject is refused without a call."""

from __future__ import annotations

import pytest

from adapters.simulators import SimProfile, start_all
from pipeline.models import AttemptResult
from pipeline.parsers.messages import parse_delivery

LONG = "ℵ" * 5000


@pytest.fixture
async def sims():
    s = await start_all(None, profile=SimProfile.clean())
    providers = s.build_providers(timeout=2.0)
    yield s, providers
    for p in providers.values():
        await p.close()
    await s.stop()


def hostile(n: int, channel: str, address: str, content: dict):
    return parse_delivery({
        "delivery_id": f"n_{n:020d}.{channel}", "notification_id": f"n_{n:020d}", "biz_key": f"h:{n}",
        "user_id": "u1", "channel": channel, "category": "transaction", "template": "t", "priority": "high",
        "address": address, "content": content,
    })


async def test_hostile_content_never_raises(sims):
    s, providers = sims
    cases = [
        ("twilio", "sms", "+15550003333", {"body": "a\x00b\r\n\u202e" + LONG}),
        ("smsvendor", "sms", "15550003334", {"body": "", "extra": {"x": [1]}}),
        ("smtp", "email", "h@example.com", {"subject": "s", "text": "line\r\n.\r\nMAIL FROM:<x@y.z>\r\n", "html": "<script>" + LONG}),
        ("smtp", "email", "h@example.com", {"subject": "", "text": "", "extra": 5}),
        ("apns", "push", "apns:" + "ab" * 32, {"title": LONG, "body": "\x00", "push_type": {"x": 1}, "badge": "lots",
                                               "sound": 5, "data": [1, 2], "category": ["c"]}),
        ("apns", "push", "apns:" + "ab" * 32, {"push_type": "alert\r\nx-evil: 1", "content_available": True}),
        ("fcm", "push", "fcm:" + "Tk_-" * 30, {"title": LONG, "data": {"a": {"b": 1}, "n": None}}),
        ("webhook", "webhook", s.webhook.url("ok") + "?q=%00", {"body": "not json {"}),
        ("webhook", "webhook", s.webhook.url("ok"), {"nobody": [1, {"x": None}]}),
    ]
    for n, (name, channel, address, content) in enumerate(cases):
        d = hostile(n, channel, address, content)
        r = await providers[name].send(d)
        assert r.result in AttemptResult.ALL, (name, r)


async def test_email_header_injection_is_refused_without_a_call(sims):
    s, providers = sims
    d = hostile(99, "email", "h@example.com", {"subject": "hi\r\nBcc: everyone@example.com", "text": "x"})
    r = await providers["smtp"].send(d)
    assert r.result == AttemptResult.PERMANENT_ERROR and r.permanent_kind == "invalid_request", r
    assert s.calls(d.delivery_id) == {}
