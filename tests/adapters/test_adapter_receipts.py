"""Receipt callbacks: signatures (Twilio, vendor), replay guard, parsers."""

from __future__ import annotations

import orjson
import pytest

from adapters.receipts import (
    MemoryReplayGuard,
    ReceiptRejected,
    ReceiptVerifier,
    RedisReplayGuard,
    parse_twilio_callback,
    parse_vendor_callback,
    twilio_signature,
    vendor_signature_header,
    verify_twilio_signature,
)

TW_URL = "https://mycompany.com/myapp.php?foo=1&bar=2"
TW_PARAMS = {"CallSid": "CA1234567890ABCDE", "Caller": "+14158675309", "Digits": "1234", "From": "+14158675309", "To": "+18005551212"}


def test_twilio_signature_matches_twilios_published_example():
    assert twilio_signature("12345", TW_URL, TW_PARAMS) == "RSOYDt4T1cUTdK1PDd93/VVr8B8="
    assert twilio_signature("12345", TW_URL, list(reversed(list(TW_PARAMS.items())))) == "RSOYDt4T1cUTdK1PDd93/VVr8B8="
    assert verify_twilio_signature("12345", TW_URL, TW_PARAMS, "RSOYDt4T1cUTdK1PDd93/VVr8B8=")
    assert not verify_twilio_signature("12345", TW_URL, {**TW_PARAMS, "Digits": "9"}, "RSOYDt4T1cUTdK1PDd93/VVr8B8=")
    assert not verify_twilio_signature("12345", TW_URL.replace("bar=2", "bar=3"), TW_PARAMS, "RSOYDt4T1cUTdK1PDd93/VVr8B8=")
    assert not verify_twilio_signature("54321", TW_URL, TW_PARAMS, "RSOYDt4T1cUTdK1PDd93/VVr8B8=")
    assert not verify_twilio_signature("12345", TW_URL, TW_PARAMS, None)


def test_twilio_signature_tolerates_default_port():
    sig = twilio_signature("t", "https://h.example/cb", {"a": "1"})
    assert verify_twilio_signature("t", "https://h.example:443/cb", {"a": "1"}, sig)
    sig = twilio_signature("t", "https://h.example:443/cb", {"a": "1"})
    assert verify_twilio_signature("t", "https://h.example/cb", {"a": "1"}, sig)


CB_URL = "https://notify.example/v1/receipts/twilio"


def twilio_cb(status="delivered", sid="SM123", **extra):
    params = {"MessageSid": sid, "MessageStatus": status, "AccountSid": "AC1", "To": "+1", "From": "+2", **extra}
    return params, twilio_signature("tok", CB_URL, params)


async def test_verifier_twilio_accepts_then_rejects_replay_and_forgery():
    v = ReceiptVerifier(twilio_auth_token="tok")
    params, sig = twilio_cb()
    receipt = await v.twilio(CB_URL, params, sig)
    assert (receipt.provider, receipt.provider_msg_id, receipt.status) == ("twilio", "SM123", "DELIVERED")
    with pytest.raises(ReceiptRejected) as e:
        await v.twilio(CB_URL, params, sig)
    assert e.value.reason == "replay"
    forged = {**params, "MessageStatus": "undelivered"}
    with pytest.raises(ReceiptRejected) as e:
        await v.twilio(CB_URL, forged, sig)
    assert e.value.reason == "bad_signature"
    with pytest.raises(ReceiptRejected) as e:
        await v.twilio(CB_URL, params, twilio_signature("attacker", CB_URL, params))
    assert e.value.reason == "bad_signature"
    # an intermediate status verifies but is no receipt
    p2, s2 = twilio_cb(status="sent", sid="SM9")
    assert await v.twilio(CB_URL, p2, s2) is None


def _vendor(secret, body: dict, ts: int):
    raw = orjson.dumps(body)
    return raw, str(ts), vendor_signature_header(secret, ts, raw)


async def test_verifier_vendor_signature_staleness_and_replay():
    now = {"t": 1_700_000_000.0}
    v = ReceiptVerifier(vendor_secret="vs", now=lambda: now["t"], guard=MemoryReplayGuard(now=lambda: now["t"]))
    raw, ts, sig = _vendor("vs", {"message_id": "vm_1", "status": "failed", "error": "absent_subscriber", "timestamp": now["t"]}, int(now["t"]))
    [r] = await v.vendor(raw, ts, sig)
    assert (r.provider, r.provider_msg_id, r.status, r.error) == ("smsvendor", "vm_1", "UNDELIVERED", "absent_subscriber")
    with pytest.raises(ReceiptRejected, match="replay"):
        await v.vendor(raw, ts, sig)
    with pytest.raises(ReceiptRejected, match="bad_signature"):
        await v.vendor(raw.replace(b"failed", b"delivered"), ts, sig)
    with pytest.raises(ReceiptRejected, match="bad_signature"):
        await v.vendor(raw, str(int(ts) + 1), sig)
    with pytest.raises(ReceiptRejected, match="bad_signature"):
        await v.vendor(raw, ts, None)
    old_raw, old_ts, old_sig = _vendor("vs", {"message_id": "vm_2", "status": "delivered"}, int(now["t"]) - 301)
    with pytest.raises(ReceiptRejected, match="stale"):
        await v.vendor(old_raw, old_ts, old_sig)
    # long after the tolerance, the same callback is stale (not merely a replay)
    now["t"] += 3600
    with pytest.raises(ReceiptRejected, match="stale"):
        await v.vendor(raw, ts, sig)


async def test_memory_replay_guard_expires_and_is_bounded():
    now = {"t": 0.0}
    g = MemoryReplayGuard(max_entries=3, now=lambda: now["t"])
    assert await g.first_seen("a", 10)
    assert not await g.first_seen("a", 10)
    now["t"] = 11
    assert await g.first_seen("a", 10)  # expired → fresh again
    for k in "bcde":
        assert await g.first_seen(k, 100)
    assert len(g) == 3  # oldest forgotten first
    assert not await g.first_seen("e", 100)


async def test_redis_replay_guard_uses_set_nx_px():
    class FakeRedis:
        def __init__(self):
            self.data, self.calls = {}, []

        async def set(self, name, value, nx=False, px=None):
            self.calls.append((name, nx, px))
            if nx and name in self.data:
                return None
            self.data[name] = value
            return True

    r = FakeRedis()
    g = RedisReplayGuard(r)
    assert await g.first_seen("k", 1.5)
    assert not await g.first_seen("k", 1.5)
    assert r.calls[0] == ("notify:receipt-seen:k", True, 1500)


def test_parsers():
    assert parse_twilio_callback({"MessageSid": "SM1", "MessageStatus": "queued"}) is None
    r = parse_twilio_callback({"SmsSid": "SM1", "SmsStatus": "failed", "ErrorCode": "30007"}, now=5.0)
    assert (r.status, r.error, r.at) == ("UNDELIVERED", "30007", 5.0)
    with pytest.raises(ReceiptRejected, match="malformed"):
        parse_twilio_callback({"MessageStatus": "delivered"})
    got = parse_vendor_callback({"receipts": [{"message_id": "a", "status": "delivered", "timestamp": 7}, {"message_id": "b", "status": "accepted"}]})
    assert [(x.provider_msg_id, x.status, x.at) for x in got] == [("a", "DELIVERED", 7.0)]
    with pytest.raises(ReceiptRejected, match="malformed"):
        parse_vendor_callback(b"not json")
    with pytest.raises(ReceiptRejected, match="malformed"):
        parse_vendor_callback([{"status": "delivered"}])


async def test_simulator_receipts_are_verified_end_to_end(twilio_sim, vendor_sim, collector, make_delivery):
    """Both simulators post signed receipts; a replay of a captured callback is refused."""
    import httpx

    from adapters.sms_twilio import TwilioConfig, TwilioSmsProvider
    from adapters.sms_vendor import VendorSmsConfig, VendorSmsProvider

    a = TwilioSmsProvider(TwilioConfig(account_sid=twilio_sim.account_sid, auth_token=twilio_sim.auth_token, from_number="+1500", base_url=twilio_sim.base_url))
    b = VendorSmsProvider(VendorSmsConfig(api_key=vendor_sim.api_key, base_url=vendor_sim.base_url))
    try:
        ra = await a.send(make_delivery("sms", "+14155550100", {"body": "x"}))
        rb = await b.send(make_delivery("sms", "+14155550100", {"body": "y"}))
        await collector.wait_for(lambda x: x.provider_msg_id == ra.provider_msg_id)
        await collector.wait_for(lambda x: x.provider_msg_id == rb.provider_msg_id)
        assert collector.rejected == []
        # replay the vendor's captured callback byte for byte
        provider, body, headers = next(x for x in collector.raw if x[0] == "smsvendor")
        keep = {k: v for k, v in headers.items() if k.lower() in ("content-type", "x-vendor-timestamp", "x-vendor-signature")}
        async with httpx.AsyncClient() as c:
            resp = await c.post(collector.base_url + "/smsvendor", content=body, headers=keep)
            assert resp.status_code == 403 and resp.json() == {"error": "replay"}
            forged = body.replace(b"delivered", b"failed")
            resp = await c.post(collector.base_url + "/smsvendor", content=forged, headers=keep)
            assert resp.json() == {"error": "bad_signature"}
    finally:
        await a.close()
        await b.close()
