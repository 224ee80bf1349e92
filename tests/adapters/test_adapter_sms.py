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
