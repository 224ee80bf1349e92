"""SMS providers A (Twilio Messages API) and B (JSON vendor) against their
simulators, including signed delivery receipts posted back to a collector."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from adapters.base import QueryStatus
from adapters.simulators.twilio_sim import IDEMPOTENCY_HEADER, RECONCILE_PARAM
from adapters.sms_twilio import TwilioConfig, TwilioSmsProvider
from adapters.sms_vendor import VendorSmsConfig, VendorSmsProvider
from pipeline.models import AttemptResult

OK = "+14155550123"


def twilio_for(sim, collector=None, **kw) -> TwilioSmsProvider:
    cfg = dict(
        account_sid=sim.account_sid,
        auth_token=sim.auth_token,
        from_number=sim.from_number,
        base_url=sim.base_url,
        status_callback=collector.base_url + "/twilio" if collector else None,
        reconcile_param=RECONCILE_PARAM,
        timeout=2.0,
    )
    cfg.update(kw)
    return TwilioSmsProvider(TwilioConfig(**cfg))


def vendor_for(sim, collector=None, **kw) -> VendorSmsProvider:
    cfg = dict(
        api_key=sim.api_key,
        base_url=sim.base_url,
        sender="NOTIFY",
        callback_url=collector.base_url + "/smsvendor" if collector else None,
        timeout=2.0,
    )
    cfg.update(kw)
    return VendorSmsProvider(VendorSmsConfig(**cfg))


# ---------------------------------------------------------------- provider A


async def test_twilio_success_and_signed_receipt(twilio_sim, collector, make_delivery):
    p = twilio_for(twilio_sim, collector)
    try:
        d = make_delivery("sms", OK, {"body": "code 123456"})
        r = await p.send(d)
        assert r.result == AttemptResult.ACCEPTED, r
        assert r.provider == "twilio" and r.provider_msg_id.startswith("SM")
        msg = twilio_sim.core.messages[r.provider_msg_id]
        assert (msg["to"], msg["from"], msg["body"]) == (OK, twilio_sim.from_number, "code 123456")
        assert msg["_key"] == d.delivery_id and msg["_callback"] == collector.base_url + "/twilio"
        receipt = await collector.wait_for(lambda x: x.provider_msg_id == r.provider_msg_id)
        assert receipt.status == "DELIVERED" and receipt.provider == "twilio"
        assert collector.rejected == []
        q = await p.query(d.delivery_id, r.provider_msg_id)
        assert (q.found, q.status) == (True, QueryStatus.DELIVERED)
    finally:
        await p.close()


async def test_twilio_undelivered_receipt(twilio_sim, collector, make_delivery):
    p = twilio_for(twilio_sim, collector)
    try:
        r = await p.send(make_delivery("sms", "+14155550005", {"body": "x"}))
        assert r.result == AttemptResult.ACCEPTED
        receipt = await collector.wait_for(lambda x: x.provider_msg_id == r.provider_msg_id)
        assert receipt.status == "UNDELIVERED" and receipt.error == "30003"
    finally:
        await p.close()


async def test_twilio_invalid_number_is_permanent(twilio_sim, collector, make_delivery):
    p = twilio_for(twilio_sim, collector)
    try:
        r = await p.send(make_delivery("sms", "+15005550001", {"body": "x"}))
        assert r.result == AttemptResult.PERMANENT_ERROR
        assert r.permanent_kind == "invalid_number" and "21211" in r.error
        r = await p.send(make_delivery("sms", "+15005550008", {"body": "x"}))
        assert r.permanent_kind == "opted_out"
    finally:
        await p.close()


async def test_twilio_5xx_is_transient(twilio_sim, collector, make_delivery):
    p = twilio_for(twilio_sim, collector)
    try:
        d = make_delivery("sms", "+14155550006", {"body": "x"})
        r = await p.send(d)
        assert r.result == AttemptResult.TRANSIENT_ERROR and r.error.startswith("503 20503")
        assert (await p.send(d)).result == AttemptResult.ACCEPTED
    finally:
        await p.close()


async def test_twilio_429_honours_retry_after(twilio_sim, collector, make_delivery):
    p = twilio_for(twilio_sim, collector)
    try:
        d = make_delivery("sms", "+14155550002", {"body": "x"})
        r = await p.send(d)
        assert r.result == AttemptResult.RATE_LIMITED and r.retry_after == 1.0
        await asyncio.sleep(r.retry_after)
        assert (await p.send(d)).result == AttemptResult.ACCEPTED
        assert twilio_sim.core.calls(d.delivery_id) == 2
    finally:
        await p.close()


async def test_twilio_timeout_is_unknown_then_reconciled_by_key(twilio_sim, collector, make_delivery):
    p = twilio_for(twilio_sim, collector, timeout=0.3)
    try:
        d = make_delivery("sms", "+14155550004", {"body": "x"})
        r = await p.send(d)
        assert r.result == AttemptResult.TIMEOUT_UNKNOWN and r.provider_msg_id is None
        q = await p.query(d.delivery_id)
        assert q.found is True and q.status in (QueryStatus.ACCEPTED, QueryStatus.DELIVERED)
        assert q.provider_msg_id == twilio_sim.core.by_key[d.delivery_id]
        assert twilio_sim.core.calls(d.delivery_id) == 1  # reconciled, not resent
        # a delivery the provider never saw
        q2 = await p.query("n_never.sms")
        assert (q2.found, q2.status, q2.supported) == (False, QueryStatus.NOT_FOUND, True)
    finally:
        await p.close()


async def test_twilio_without_list_extension_cannot_reconcile_by_key(twilio_sim, make_delivery):
    p = twilio_for(twilio_sim, reconcile_param=None)
    try:
        q = await p.query("n_x.sms")
        assert q.supported is False and q.status == QueryStatus.NOT_FOUND
    finally:
        await p.close()


async def test_twilio_bad_credentials_and_unreachable(twilio_sim, make_delivery, free_port):
    p = twilio_for(twilio_sim, auth_token="wrong")
    try:
        r = await p.send(make_delivery("sms", OK, {"body": "x"}))
        assert r.result == AttemptResult.TRANSIENT_ERROR and r.error.startswith("auth: 401 20003")
    finally:
        await p.close()
    p = twilio_for(twilio_sim, base_url=f"http://127.0.0.1:{free_port}")
    try:
        r = await p.send(make_delivery("sms", OK, {"body": "x"}))
        assert r.result == AttemptResult.TRANSIENT_ERROR and r.error.startswith("connect:")
        q = await p.query("n_x.sms")
        assert q.status == QueryStatus.ERROR and not q.found
    finally:
        await p.close()


async def test_twilio_wire_format(twilio_sim):
    """Form-encoded POST with Basic auth, as Twilio's API takes it."""
    async with httpx.AsyncClient(base_url=twilio_sim.base_url) as c:
        resp = await c.post(
            f"/2010-04-01/Accounts/{twilio_sim.account_sid}/Messages.json",
            data={"To": OK, "From": "+15005550006", "Body": "hi"},
            auth=(twilio_sim.account_sid, twilio_sim.auth_token),
            headers={IDEMPOTENCY_HEADER: "k1"},
        )
        assert resp.status_code == 201
        body = resp.json()
        assert body["status"] == "queued" and body["sid"].startswith("SM")
        resp = await c.get(f"/2010-04-01/Accounts/{twilio_sim.account_sid}/Messages/{body['sid']}.json", auth=(twilio_sim.account_sid, twilio_sim.auth_token))
        assert resp.json()["sid"] == body["sid"]
        ledger = (await c.get("/_sim/ledger", params={"key": "k1"})).json()
        assert [(row["op"], row["status"]) for row in ledger["calls"]] == [("send", 201), ("query", 200)]


# ---------------------------------------------------------------- provider B


async def test_vendor_success_and_signed_receipt(vendor_sim, collector, make_delivery):
    p = vendor_for(vendor_sim, collector)
    try:
        d = make_delivery("sms", OK, {"body": "code 1"})
        r = await p.send(d)
        assert r.result == AttemptResult.ACCEPTED and r.provider == "smsvendor"
        msg = vendor_sim.core.messages[r.provider_msg_id]
        assert (msg["client_ref"], msg["to"], msg["_text"]) == (d.delivery_id, OK, "code 1")
        receipt = await collector.wait_for(lambda x: x.provider_msg_id == r.provider_msg_id)
        assert receipt.status == "DELIVERED"
        q = await p.query(d.delivery_id)
        assert (q.found, q.status, q.provider_msg_id) == (True, QueryStatus.DELIVERED, r.provider_msg_id)
    finally:
        await p.close()


async def test_vendor_errors(vendor_sim, collector, make_delivery):
    p = vendor_for(vendor_sim, collector)
    try:
        r = await p.send(make_delivery("sms", "+15005550001", {"body": "x"}))
        assert (r.result, r.permanent_kind) == (AttemptResult.PERMANENT_ERROR, "invalid_number")
        r = await p.send(make_delivery("sms", "+15005550007", {"body": "x"}))
        assert r.result == AttemptResult.TRANSIENT_ERROR
        r = await p.send(make_delivery("sms", "+15005550002", {"body": "x"}))
        assert r.result == AttemptResult.RATE_LIMITED and r.retry_after == 1.0
    finally:
        await p.close()
    bad = vendor_for(vendor_sim, api_key="nope")
    try:
        r = await bad.send(make_delivery("sms", OK, {"body": "x"}))
        assert r.result == AttemptResult.TRANSIENT_ERROR and r.error.startswith("auth: 401")
    finally:
        await bad.close()


async def test_vendor_timeout_reconciles_and_resend_is_deduplicated(vendor_sim, collector, make_delivery):
    p = vendor_for(vendor_sim, collector, timeout=0.3)
    try:
        d = make_delivery("sms", "+14155550004", {"body": "x"})
        r = await p.send(d)
        assert r.result == AttemptResult.TIMEOUT_UNKNOWN
        q = await p.query(d.delivery_id)
        assert q.found and q.status in (QueryStatus.ACCEPTED, QueryStatus.DELIVERED)
        assert (await p.query("n_unknown.sms")).status == QueryStatus.NOT_FOUND
    finally:
        await p.close()
    # the vendor keys on client_ref: a resend under the same key does not send twice
    p = vendor_for(vendor_sim, collector)
    try:
        vendor_sim.core.set_mode({"mode": "ok"})
        d2 = make_delivery("sms", OK, {"body": "y"})
        a = await p.send(d2)
        b = await p.send(d2)
        assert a.provider_msg_id == b.provider_msg_id
        assert [row["outcome"] for row in vendor_sim.core.ledger_view(d2.delivery_id) if row["op"] == "send"] == ["accepted", "duplicate"]
    finally:
        await p.close()


@pytest.mark.parametrize("mode", ["down", "flaky"])
async def test_runtime_modes(vendor_sim, make_delivery, mode):
    vendor_sim.core.set_mode({"mode": mode, "rate": 1.0})
    p = vendor_for(vendor_sim)
    try:
        r = await p.send(make_delivery("sms", OK, {"body": "x"}))
        assert r.result == AttemptResult.TRANSIENT_ERROR
    finally:
        await p.close()


async def test_mode_control_endpoint_with_count(vendor_sim, make_delivery):
    async with httpx.AsyncClient(base_url=vendor_sim.base_url) as c:
        resp = await c.post("/_sim/mode", json={"mode": "ratelimit", "retry_after": 2, "count": 1})
        assert resp.json()["mode"] == "ratelimit"
    p = vendor_for(vendor_sim)
    try:
        r = await p.send(make_delivery("sms", OK, {"body": "x"}))
        assert r.result == AttemptResult.RATE_LIMITED and r.retry_after == 2.0
        r = await p.send(make_delivery("sms", OK, {"body": "x"}))
        assert r.result == AttemptResult.ACCEPTED
    finally:
        await p.close()


# ---------------------------------------------------------------- issue 28: as Twilio answers and calls back


async def test_twilio_21408_region_not_enabled_fails_over_to_the_other_provider(twilio_sim, vendor_sim, make_delivery):
    """21408: our Twilio account may not send to that region. The number is fine and
    Twilio is healthy: the other SMS provider takes it, Twilio's breaker stays closed."""
    from adapters.dispatch import Dispatcher

    disp = Dispatcher({"twilio": twilio_for(twilio_sim), "smsvendor": vendor_for(vendor_sim)},
                      {"sms": ["twilio", "smsvendor"]}, breaker={"failure_threshold": 3})
    try:
        for i in range(4):
            rnd = await disp.send(make_delivery("sms", f"+4420794{i:02d}0010", {"body": "hi"}))
            assert [(r.provider, r.result) for r in rnd.results] == [("twilio", "TRANSIENT_ERROR"), ("smsvendor", "ACCEPTED")]
            assert rnd.results[0].fault == "route" and rnd.results[0].error.startswith("route: 400 21408")
        assert disp.breakers["twilio"].state == "closed"
        rnd = await disp.send(make_delivery("sms", OK, {"body": "hi"}))
        assert [(r.provider, r.result) for r in rnd.results] == [("twilio", "ACCEPTED")]
    finally:
        await disp.close()


async def test_twilio_sim_blocks_regions_like_geo_permissions(profile, make_delivery):
    from adapters.simulators.twilio_sim import TwilioSim

    sim = TwilioSim(profile, blocked_regions=("+44",))
    await sim.start()
    p = twilio_for(sim)
    try:
        r = await p.send(make_delivery("sms", "+447700900123", {"body": "hi"}))
        assert (r.result, r.fault) == (AttemptResult.TRANSIENT_ERROR, "route") and "21408" in r.error
        assert (await p.send(make_delivery("sms", OK, {"body": "hi"}))).result == AttemptResult.ACCEPTED
    finally:
        await p.close()
        await sim.stop()


@pytest.mark.parametrize("variant", ["query", "shared_key", "repeat"])
async def test_twilio_sim_callbacks_verify_with_twilios_validator(profile, collector, make_delivery, variant):
    """The simulator calls back as Twilio does: a callback URL with a query string,
    SharedKey HMAC-SHA256 signing, a callback repeated identical; twilio's own
    RequestValidator (the judge) and our verifier accept each, and a repeat is
    acknowledged without a second receipt."""
    from twilio.request_validator import RequestValidator, get_signature_algorithm

    from adapters.receipts import ReceiptVerifier, parse_form
    from adapters.simulators.twilio_sim import TwilioSim

    shared = ("SK" + "0" * 32, "shared-secret") if variant == "shared_key" else None
    url = collector.base_url + "/twilio" + ("?tenant=acme&cb=a%20b" if variant == "query" else "")
    sim = TwilioSim(profile, receipts_url=url, shared_key=shared, repeat_callbacks=variant == "repeat")
    await sim.start()
    collector.holder["v"] = ReceiptVerifier(twilio_auth_token=sim.auth_token, twilio_shared_keys=dict([shared]) if shared else None)
    p = twilio_for(sim, status_callback=url)
    try:
        r = await p.send(make_delivery("sms", OK, {"body": "code"}))
        await collector.wait_for(lambda x: x.provider_msg_id == r.provider_msg_id)
        await asyncio.sleep(0.3)
        assert collector.rejected == []
        raw = [(b, h) for prov, b, h in collector.raw if prov == "twilio"]
        assert len(raw) == (4 if variant == "repeat" else 2)  # sent, delivered (each twice)
        for body, headers in raw:
            settings = headers.get("X-Twilio-Webhooks-Signature-Settings")
            judge = RequestValidator(shared[1] if shared else sim.auth_token)
            assert judge.validate(url, dict(parse_form(body)), headers["X-Twilio-Signature"],
                                  get_signature_algorithm(settings)), (url, headers)
        assert len([x for x in collector.receipts if x.provider_msg_id == r.provider_msg_id]) == 1
        assert {row["status"] for row in sim.core.receipts} == {200}
    finally:
        await p.close()
        await sim.stop()
