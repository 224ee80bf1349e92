"""start_all: every simulator up at once, the providers built from its configs,
the control API over each protocol, and the default (realistic) profile."""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx
import pytest

from adapters.inbox import InboxProvider
from adapters.registry import build_provider
from adapters.simulators import SimProfile, start_all
from pipeline.models import AttemptResult


async def test_start_all_and_one_delivery_per_provider(collector, make_delivery):
    sims = await start_all(collector.base_url, profile=SimProfile.clean(), smtp_tls=True, smtp_auth=True)
    providers = sims.build_providers(timeout=3)
    collector.holder["v"] = sims.receipt_verifier()
    try:
        cases = {
            "apns": make_delivery("push", "apns:abc123", {"title": "t", "body": "b"}),
            "fcm": make_delivery("push", "fcm:xyz", {"title": "t", "body": "b"}),
            "twilio": make_delivery("sms", "+14155550100", {"body": "hi"}),
            "smsvendor": make_delivery("sms", "+14155550100", {"body": "hi"}),
            "smtp": make_delivery("email", "a@example.org", {"subject": "s", "text": "t", "html": "<b>h</b>"}),
            "webhook": make_delivery("webhook", sims.webhook.url("ok"), {"body": {"k": "v"}}),
            "inbox": make_delivery("inbox", "", {"title": "t", "body": "b"}),
        }
        results = dict(zip(cases, await asyncio.gather(*(providers[n].send(d) for n, d in cases.items())), strict=True))
        for name, r in results.items():
            assert r.result == AttemptResult.ACCEPTED, (name, r)
            assert r.provider == name
        for name in ("apns", "fcm", "twilio", "smsvendor", "smtp", "webhook"):
            assert sims.calls(cases[name].delivery_id) == {name: 1}
        # SMS receipts reach <receipts_url>/<provider>, signed, and verify
        await collector.wait_for(lambda x: x.provider_msg_id == results["twilio"].provider_msg_id)
        await collector.wait_for(lambda x: x.provider_msg_id == results["smsvendor"].provider_msg_id)
        assert collector.rejected == []
        info = sims.as_dict()
        assert info["urls"]["twilio"] == sims.twilio.base_url and info["smtp"]["cert_pem"].startswith("-----BEGIN CERTIFICATE")
    finally:
        for p in providers.values():
            await p.close()
        await sims.stop()


async def test_control_api_over_http1_and_h2(make_delivery):
    sims = await start_all(None, profile=SimProfile.clean())
    providers = sims.build_providers(timeout=3)
    try:
        async with httpx.AsyncClient(http1=False, http2=True) as h2c:
            resp = await h2c.post(sims.apns.base_url + "/_sim/mode", json={"mode": "down", "status": 500, "for_s": 30})
            assert resp.http_version == "HTTP/2" and resp.json()["mode"] == "down"
            d = make_delivery("push", "apns:abc", {"title": "t", "body": "b"})
            r = await providers["apns"].send(d)
            assert r.result == AttemptResult.TRANSIENT_ERROR
            ledger = (await h2c.get(sims.apns.base_url + "/_sim/ledger", params={"key": d.delivery_id})).json()
            assert [row["status"] for row in ledger["calls"]] == [500]
            await h2c.post(sims.apns.base_url + "/_sim/mode", json={"mode": "ok"})
            assert (await providers["apns"].send(d)).result == AttemptResult.ACCEPTED
        async with httpx.AsyncClient() as c:
            resp = await c.post(sims.twilio.base_url + "/_sim/mode", json={"mode": "bogus"})
            assert resp.status_code == 400
            resp = await c.post(sims.twilio.base_url + "/_sim/mode", json={"mode": "timeout", "count": 1})
            assert resp.json() == {"mode": "timeout", "count": 1}
        slow = build_provider("twilio", {**vars(sims.provider_configs()["twilio"]), "timeout": 0.3})
        try:
            d = make_delivery("sms", "+14155550100", {"body": "x"})
            assert (await slow.send(d)).result == AttemptResult.TIMEOUT_UNKNOWN
            assert (await slow.query(d.delivery_id)).found
        finally:
            await slow.close()
        assert sims.twilio.core.mode_info() == {"mode": "ok"}  # count consumed
    finally:
        for p in providers.values():
            await p.close()
        await sims.stop()


async def test_realistic_profile_is_mostly_successful(make_delivery):
    sims = await start_all(None, profile=SimProfile.realistic(seed=7, slow_s=(0.05, 0.1)))
    p = sims.build_providers(timeout=3)["smsvendor"]
    try:
        results = await asyncio.gather(*(p.send(make_delivery("sms", f"+1415555{1000 + i}", {"body": "x"})) for i in range(200)))
        counts = Counter(r.result for r in results)
        assert counts[AttemptResult.ACCEPTED] >= 180, counts
        assert set(counts) <= {AttemptResult.ACCEPTED, AttemptResult.TRANSIENT_ERROR, AttemptResult.RATE_LIMITED}
    finally:
        await p.close()
        await sims.stop()


async def test_inbox_and_registry(make_delivery):
    d = make_delivery("inbox", "", {"title": "t", "body": "b"})
    r = await InboxProvider().send(d)
    assert (r.result, r.provider_msg_id) == (AttemptResult.ACCEPTED, d.delivery_id)
    with pytest.raises(ValueError, match="unknown settings"):
        build_provider("twilio", {"account_sid": "AC", "auth_token": "x", "from_number": "+1", "bogus": 1})
    with pytest.raises(ValueError, match="unknown provider kind"):
        build_provider("pigeon", {})
    w = build_provider("webhook", {"secret": "whsec_c2VjcmV0LWtleQ==", "allow": "127.0.0.1, 10.0.0.0/8"})
    assert w.config.allow == ("127.0.0.1", "10.0.0.0/8") and w.name == "webhook"
    await w.close()
    with pytest.raises(ValueError, match="whsec_"):  # a secret in another format fails at start, not per send
        build_provider("webhook", {"secret": "not base64!"})


def test_sim_state_is_bounded_for_long_demos():
    from adapters.simulators.common import SimCore

    core = SimCore("x", SimProfile.clean(), max_ledger=5, max_messages=4)
    for i in range(10):
        core.messages[f"m{i}"] = {"key": f"k{i}"}
        core.by_key[f"k{i}"] = f"m{i}"
        core.record(op="send", key=f"k{i}")
    assert len(core.ledger) == 5 and core.ledger[-1]["key"] == "k9"
    assert len(core.messages) <= 4 and "m9" in core.messages and "m0" not in core.messages
    assert set(core.by_key) == {m["key"] for m in core.messages.values()}
