"""POST /v1/receipts/{provider}: signed receipts are written to notify.receipts
(keyed by provider_msg_id); forged, stale and replayed ones are 401 and counted;
the real provider simulators' callbacks are accepted."""

from __future__ import annotations

import asyncio
import base64
import time

import aiohttp
import orjson
import redis
from prometheus_client import REGISTRY

from adapters.receipts import twilio_signature, vendor_signature_header
from adapters.simulators import SimProfile
from adapters.simulators.twilio_sim import TwilioSim
from adapters.simulators.vendor_sim import VendorSim
from pipeline.transport.keys import Keys

PARTITIONS = 4
TWILIO_TOKEN = "twilio-test-token"  # tests/api/conftest.py
VENDOR_SECRET = "vendor-test-secret"


def receipts(url):
    r = redis.Redis.from_url(url)
    keys = Keys()
    out = [(f[b"k"].decode(), orjson.loads(f[b"v"])) for p in range(PARTITIONS)
           for _e, f in r.xrange(keys.stream("notify.receipts", p))]
    r.close()
    return out


def rejected(provider, reason) -> float:
    return REGISTRY.get_sample_value("notify_receipts_rejected_total", {"provider": provider, "reason": reason}) or 0.0


def twilio_form(sid="SM1", status="delivered", **extra):
    return {"AccountSid": "AC1", "MessageSid": sid, "SmsSid": sid, "MessageStatus": status, "SmsStatus": status,
            "To": "+15550001", "From": "+15550002", **extra}


async def post_twilio(api, form, token=TWILIO_TOKEN, signature=None):
    url = api.url + "/v1/receipts/twilio"
    sig = signature if signature is not None else twilio_signature(token, url, form)
    return await api.call("POST", "/v1/receipts/twilio", None, data=form, headers={"X-Twilio-Signature": sig})


async def post_vendor(api, body: bytes, ts=None, secret=VENDOR_SECRET, signature=None):
    ts = str(int(time.time())) if ts is None else str(ts)
    sig = signature if signature is not None else vendor_signature_header(secret, ts, body)
    return await api.call("POST", "/v1/receipts/smsvendor", None, data=body,
                          headers={"Content-Type": "application/json", "X-Vendor-Timestamp": ts,
                                   "X-Vendor-Signature": sig})


async def test_twilio_good_forged_replayed(api):
    before_bad, before_replay = rejected("twilio", "bad_signature"), rejected("twilio", "replay")
    status, body = await post_twilio(api, twilio_form("SMa"))
    assert status == 200 and body == {"received": 1}
    assert receipts(api.redis_url) == [("SMa", receipts(api.redis_url)[0][1])]
    r = receipts(api.redis_url)[0][1]
    assert r["provider"] == "twilio" and r["provider_msg_id"] == "SMa" and r["status"] == "DELIVERED"

    # forged: signed with another token; and a valid signature over other params
    status, body = await post_twilio(api, twilio_form("SMb"), token="not-the-token")
    assert status == 401 and body["error"]["code"] == "bad_signature"
    sig = twilio_signature(TWILIO_TOKEN, api.url + "/v1/receipts/twilio", twilio_form("SMb"))
    status, body = await post_twilio(api, twilio_form("SMb", status="undelivered"), signature=sig)
    assert status == 401
    status, body = await post_twilio(api, twilio_form("SMb"), signature="")
    assert status == 401
    # the exact callback again (Twilio retries one whose answer it did not get):
    # acknowledged, idempotently, and not written twice
    status, body = await post_twilio(api, twilio_form("SMa"))
    assert status == 200 and body == {"received": 0}
    assert len(receipts(api.redis_url)) == 1
    assert rejected("twilio", "bad_signature") == before_bad + 3
    assert rejected("twilio", "replay") == before_replay

    # an intermediate status is acknowledged, nothing written
    status, body = await post_twilio(api, twilio_form("SMc", status="sent"))
    assert status == 200 and body == {"received": 0}
    # undelivered carries the error code
    status, body = await post_twilio(api, twilio_form("SMd", status="undelivered", ErrorCode="30003"))
    assert status == 200
    last = {k: v for k, v in receipts(api.redis_url)}["SMd"]
    assert last["status"] == "UNDELIVERED" and last["error"] == "30003"


async def test_vendor_good_forged_stale_replayed(api):
    body = orjson.dumps({"message_id": "vm_1", "status": "delivered", "timestamp": time.time()})
    ts = int(time.time())
    status, resp = await post_vendor(api, body, ts=ts)
    assert status == 200 and resp == {"received": 1}
    assert [k for k, _v in receipts(api.redis_url)] == ["vm_1"]
    before = rejected("smsvendor", "replay")
    status, resp = await post_vendor(api, body, ts=ts)  # the same signed callback again
    assert status == 401 and resp["error"]["code"] == "replay"
    assert rejected("smsvendor", "replay") == before + 1
    status, resp = await post_vendor(api, body, secret="wrong")
    assert status == 401 and resp["error"]["code"] == "bad_signature"
    status, resp = await post_vendor(api, body, ts=int(time.time()) - 3600)
    assert status == 401 and resp["error"]["code"] == "stale"
    status, resp = await post_vendor(api, b"[1, 2]")
    assert status == 400 and resp["error"]["code"] == "malformed"
    batch = orjson.dumps({"receipts": [{"message_id": "vm_2", "status": "failed", "error": "absent"},
                                       {"message_id": "vm_3", "status": "queued"}]})
    status, resp = await post_vendor(api, batch)
    assert status == 200 and resp == {"received": 1}
    assert {k for k, _v in receipts(api.redis_url)} == {"vm_1", "vm_2"}
    status, resp = await api.call("POST", "/v1/receipts/carrier-pigeon", None, data=b"{}")
    assert status == 404 and resp["error"]["code"] == "unknown_provider"


async def test_failed_write_lets_the_retry_through(api, monkeypatch):
    from pipeline.api.app import API_KEY

    writer = api.app[API_KEY].writer

    async def broken(messages):
        raise ConnectionError("broker gone")

    monkeypatch.setattr(writer, "send", broken)
    form = twilio_form("SMr")
    status, _ = await post_twilio(api, form)
    assert status == 503
    monkeypatch.undo()
    status, body = await post_twilio(api, form)  # the provider retries the same signed callback
    assert status == 200 and body == {"received": 1}


async def test_simulators_callbacks_are_accepted(api):
    """The protocol simulators post real callbacks (sent, then delivered) to the API."""
    profile = SimProfile.clean()
    twilio = TwilioSim(profile, auth_token=TWILIO_TOKEN, receipts_url=api.url + "/v1/receipts/twilio")
    vendor = VendorSim(profile, webhook_secret=VENDOR_SECRET, receipts_url=api.url + "/v1/receipts/smsvendor")
    await twilio.start()
    await vendor.start()
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(
                f"{twilio.base_url}/2010-04-01/Accounts/{twilio.account_sid}/Messages.json",
                data={"To": "+15551239991", "From": twilio.from_number, "Body": "hi"},
                headers={"Authorization": "Basic " + base64.b64encode(
                    f"{twilio.account_sid}:{TWILIO_TOKEN}".encode()).decode()},
            ) as resp:
                assert resp.status == 201, await resp.text()
                sid = (await resp.json())["sid"]
            async with http.post(f"{vendor.base_url}/v1/sms/send", headers={"X-Api-Key": vendor.api_key},
                                 json={"to": "+15551239992", "text": "hi", "client_ref": "d1"}) as resp:
                assert resp.status == 200, await resp.text()
                mid = (await resp.json())["message_id"]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            got = dict(receipts(api.redis_url))
            if sid in got and mid in got:
                break
            await asyncio.sleep(0.05)
        got = dict(receipts(api.redis_url))
        assert got[sid]["status"] == "DELIVERED" and got[sid]["provider"] == "twilio"
        assert got[mid]["status"] == "DELIVERED" and got[mid]["provider"] == "smsvendor"
        await asyncio.sleep(0.1)
        assert {r["status"] for r in twilio.core.receipts} == {200}  # "sent" and "delivered" both acknowledged
        assert {r["status"] for r in vendor.core.receipts} == {200}
    finally:
        await twilio.stop()
        await vendor.stop()


async def test_twilio_callbacks_accepted_as_twilios_request_validator_accepts_them(api):
    """Issue 28, judged by twilio's own RequestValidator: a callback URL with a query
    string, one signed without the port, SharedKey HMAC-SHA256 signing and the JSON
    variant with bodySHA256 are accepted (an identical retry too, idempotently);
    one signed with another token is refused."""
    import hashlib

    from twilio.request_validator import RequestValidator, get_signature_algorithm

    judge = RequestValidator(TWILIO_TOKEN)
    base = api.url + "/v1/receipts/twilio"
    no_port = "http://127.0.0.1/v1/receipts/twilio"
    json_body = orjson.dumps({"MessageSid": "SMj", "MessageStatus": "delivered"})
    json_path = "/v1/receipts/twilio?bodySHA256=" + hashlib.sha256(json_body).hexdigest()
    sha256 = {"X-Twilio-Webhooks-Signature-Settings": "key=SKnotify,algorithm=HMAC_SHA256"}
    cases = [
        # (path called, form or raw JSON body, URL signed, extra headers)
        ("/v1/receipts/twilio?tenant=acme&cb=a%20b", twilio_form("SMq"), base + "?tenant=acme&cb=a%20b", {}),
        ("/v1/receipts/twilio", twilio_form("SMp"), no_port, {}),
        ("/v1/receipts/twilio", twilio_form("SMs"), base, sha256),
        (json_path, json_body, api.url + json_path, {}),
    ]
    for path, data, signed_url, extra in cases:
        alg = get_signature_algorithm(extra.get("X-Twilio-Webhooks-Signature-Settings"))
        params = {} if isinstance(data, bytes) else data
        sig = judge.compute_signature(signed_url, params, alg)
        as_called = api.url + path
        assert judge.validate(as_called, data.decode() if isinstance(data, bytes) else data, sig, alg), path
        headers = {"X-Twilio-Signature": sig, **extra}
        if isinstance(data, bytes):
            headers["Content-Type"] = "application/json"
        status, body = await api.call("POST", path, None, data=data, headers=headers)
        assert status == 200 and body == {"received": 1}, (path, body)
        status, body = await api.call("POST", path, None, data=data, headers=headers)  # Twilio's retry
        assert status == 200 and body == {"received": 0}, (path, body)
        forged = RequestValidator("another-token").compute_signature(signed_url, params, alg)
        assert not judge.validate(as_called, data.decode() if isinstance(data, bytes) else data, forged, alg)
        status, body = await api.call("POST", path, None, data=data, headers={**headers, "X-Twilio-Signature": forged})
        assert status == 401 and body["error"]["code"] == "bad_signature", (path, body)
    got = dict(receipts(api.redis_url))
    assert {"SMq", "SMp", "SMs", "SMj"} <= set(got) and len(receipts(api.redis_url)) == 4
