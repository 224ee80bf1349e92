"""APNs adapter against the HTTP/2 simulator."""

from __future__ import annotations

import time
import uuid

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from adapters.apns import ApnsConfig, ApnsProvider, apns_id_for
from adapters.base import QueryStatus
from pipeline.models import AttemptResult


def provider_for(sim, **kw) -> ApnsProvider:
    c = sim.credentials()
    cfg = dict(team_id=c["team_id"], key_id=c["key_id"], private_key=c["private_key"], topic=c["topic"], base_url=sim.base_url, timeout=2.0)
    clock = kw.pop("clock", time.time)
    cfg.update(kw)
    return ApnsProvider(ApnsConfig(**cfg), clock=clock)


async def test_success_sends_apns_headers_and_jwt(apns_sim, make_delivery):
    p = provider_for(apns_sim)
    try:
        d = make_delivery("push", "apns:0123abcd", {"title": "Hi", "body": "there", "badge": 3}, priority="high")
        r = await p.send(d)
        assert r.result == AttemptResult.ACCEPTED, r
        assert r.provider == "apns" and r.provider_msg_id == apns_id_for(d.delivery_id)
        uuid.UUID(r.provider_msg_id)
        msg = apns_sim.core.messages[r.provider_msg_id]
        h = msg["headers"]
        assert h[":method"] == "POST" and h[":path"] == "/3/device/0123abcd"
        assert h["apns-topic"] == apns_sim.topic
        assert h["apns-push-type"] == "alert"
        assert h["apns-priority"] == "10"
        assert h["apns-collapse-id"] == d.delivery_id
        assert int(h["apns-expiration"]) > time.time()
        claims = jwt.decode(h["authorization"].split()[1], options={"verify_signature": False})
        assert claims["iss"] == apns_sim.team_id
        assert jwt.get_unverified_header(h["authorization"].split()[1])["kid"] == apns_sim.key_id
        assert msg["payload"] == {"aps": {"alert": {"title": "Hi", "body": "there"}, "badge": 3}, "notify_id": d.delivery_id}
        # normal priority → 5; the JWT is cached across sends
        r2 = await p.send(make_delivery("push", "apns:0123abce", priority="normal"))
        assert r2.result == AttemptResult.ACCEPTED
        h2 = apns_sim.core.messages[r2.provider_msg_id]["headers"]
        assert h2["apns-priority"] == "5"
        assert h2["authorization"] == h["authorization"]
    finally:
        await p.close()


@pytest.mark.parametrize("token,status", [("bad-device", "400 BadDeviceToken"), ("gone-device", "410 Unregistered")])
async def test_dead_tokens_are_permanent_bad_token(apns_sim, make_delivery, token, status):
    p = provider_for(apns_sim)
    try:
        r = await p.send(make_delivery("push", f"apns:{token}"))
        assert r.result == AttemptResult.PERMANENT_ERROR
        assert r.permanent_kind == "bad_token"
        assert r.error == status
    finally:
        await p.close()


async def test_5xx_is_transient_then_recovers(apns_sim, make_delivery):
    p = provider_for(apns_sim)
    try:
        d = make_delivery("push", "apns:flaky-1")
        r1 = await p.send(d)
        assert r1.result == AttemptResult.TRANSIENT_ERROR and "503" in r1.error
        r2 = await p.send(d)
        assert r2.result == AttemptResult.ACCEPTED
        assert apns_sim.core.calls(d.delivery_id) == 2
        r3 = await p.send(make_delivery("push", "apns:error-1"))
        assert r3.result == AttemptResult.TRANSIENT_ERROR and "500" in r3.error
    finally:
        await p.close()


async def test_429_is_rate_limited(apns_sim, make_delivery):
    p = provider_for(apns_sim)
    try:
        r = await p.send(make_delivery("push", "apns:throttle-1"))
        assert r.result == AttemptResult.RATE_LIMITED
        assert r.retry_after is None  # APNs sends no Retry-After: the pipeline backs off
    finally:
        await p.close()


async def test_timeout_after_accept_is_unknown(apns_sim, make_delivery):
    p = provider_for(apns_sim, timeout=0.3)
    try:
        d = make_delivery("push", "apns:hang-1")
        r = await p.send(d)
        assert r.result == AttemptResult.TIMEOUT_UNKNOWN, r
        # the provider did take it ...
        [row] = apns_sim.core.ledger_view(d.delivery_id)
        assert row["accepted"] is True and row["status"] == "hang"
        # ... but APNs has no status query: the adapter says so instead of guessing
        q = await p.query(d.delivery_id, None)
        assert q.supported is False and q.found is False and q.status == QueryStatus.NOT_FOUND
    finally:
        await p.close()


async def test_wrong_signing_key_is_auth_failure_not_permanent(apns_sim, make_delivery):
    other = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    p = provider_for(apns_sim, private_key=other)
    try:
        r = await p.send(make_delivery("push", "apns:abcd"))
        assert r.result == AttemptResult.TRANSIENT_ERROR
        assert r.error.startswith("auth: 403 InvalidProviderToken")
    finally:
        await p.close()


async def test_expired_provider_token_is_renewed_once(apns_sim, make_delivery):
    offset = {"s": -7200.0}
    p = provider_for(apns_sim, clock=lambda: time.time() + offset["s"], token_ttl=10**9)
    try:
        old = p.bearer_token()  # iat two hours ago
        offset["s"] = 0.0
        r = await p.send(make_delivery("push", "apns:abcd"))
        assert r.result == AttemptResult.ACCEPTED, r
        assert p.bearer_token() != old
        outcomes = [row["outcome"] for row in apns_sim.core.ledger]
        assert outcomes == ["ExpiredProviderToken", "accepted"]
    finally:
        await p.close()


def test_token_is_cached_and_refreshed_before_an_hour(apns_sim):
    now = {"t": 1_700_000_000.0}
    p = provider_for(apns_sim, clock=lambda: now["t"])
    t1 = p.bearer_token()
    now["t"] += 49 * 60
    assert p.bearer_token() == t1
    now["t"] += 2 * 60  # 51 min: past token_ttl (50 min), before Apple's 60
    t2 = p.bearer_token()
    assert t2 != t1
    assert jwt.decode(t2, options={"verify_signature": False})["iat"] == int(now["t"])


async def test_provider_down_and_connection_refused(apns_sim, make_delivery, free_port):
    p = provider_for(apns_sim)
    try:
        apns_sim.core.set_mode({"mode": "down"})
        r = await p.send(make_delivery("push", "apns:abcd"))
        assert r.result == AttemptResult.TRANSIENT_ERROR and "503" in r.error
    finally:
        await p.close()
    refused = ApnsProvider(
        ApnsConfig(team_id="T", key_id="K", private_key=apns_sim.private_key_pem, topic="x", base_url=f"http://127.0.0.1:{free_port}", timeout=1)
    )
    try:
        r = await refused.send(make_delivery("push", "apns:abcd"))
        assert r.result == AttemptResult.TRANSIENT_ERROR and r.error.startswith("connect:")
    finally:
        await refused.close()


async def test_fcm_address_is_refused_without_a_call(apns_sim, make_delivery):
    p = provider_for(apns_sim)
    try:
        r = await p.send(make_delivery("push", "fcm:abc"))
        assert r.result == AttemptResult.PERMANENT_ERROR
        assert len(apns_sim.core.ledger) == 0
    finally:
        await p.close()


async def test_tls_with_alpn_h2_like_apple(profile, make_delivery):
    """The same adapter over TLS + ALPN h2, trusting the simulator's certificate."""
    from adapters.simulators.apns_sim import ApnsSim
    from adapters.simulators.tls import client_tls_context

    sim = ApnsSim(profile, tls=True)
    await sim.start()
    try:
        assert sim.base_url.startswith("https://")
        p = provider_for(sim, verify=client_tls_context(sim.cert_pem))
        try:
            r = await p.send(make_delivery("push", "apns:abcdef"))
            assert r.result == AttemptResult.ACCEPTED, r
        finally:
            await p.close()
        # an untrusted certificate never gets a request through
        p = provider_for(sim)
        try:
            r = await p.send(make_delivery("push", "apns:abcdef"))
            assert r.result == AttemptResult.TRANSIENT_ERROR and r.error.startswith("connect:")
        finally:
            await p.close()
        assert len(sim.core.ledger) == 1
    finally:
        await sim.stop()
