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


async def test_429_is_rate_limited_for_that_device(apns_sim, make_delivery):
    p = provider_for(apns_sim, device_retry_after=12.0)
    try:
        r = await p.send(make_delivery("push", "apns:throttle-1"))
        assert r.result == AttemptResult.RATE_LIMITED and r.error == "429 TooManyRequests"
        assert r.fault == "recipient"  # one device's limit: the provider is healthy
        assert r.retry_after == 12.0  # APNs sends no Retry-After: the delivery backs off this long
        # the throttle is the device's, whatever the message
        assert (await p.send(make_delivery("push", "apns:throttle-1"))).result == AttemptResult.ACCEPTED
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


# ------------------------------------------------------------------ issue 28: as Apple answers


async def test_one_throttled_device_never_opens_the_breaker(profile, make_delivery):
    """429 TooManyRequests is per device token: five of them for one device do not
    open the apns breaker, and the next healthy device is sent at once."""
    from adapters.dispatch import Dispatcher
    from adapters.simulators.apns_sim import ApnsSim

    sim = ApnsSim(profile, device_rate=(1, 60.0))  # one push per device a minute
    await sim.start()
    disp = Dispatcher({"apns": provider_for(sim)}, {"push": ["apns"]}, breaker={"failure_threshold": 5})
    try:
        results = []
        for _ in range(6):
            rnd = await disp.send(make_delivery("push", "apns:busy-device"))
            results.extend(r.result for r in rnd.results)
        assert results == [AttemptResult.ACCEPTED] + [AttemptResult.RATE_LIMITED] * 5
        assert disp.breakers["apns"].state == "closed"
        rnd = await disp.send(make_delivery("push", "apns:quiet-device"))
        assert [r.result for r in rnd.results] == [AttemptResult.ACCEPTED] and rnd.wait_s is None
    finally:
        await disp.close()
        await sim.stop()


async def test_expired_provider_token_is_renewed_once_for_concurrent_requests(profile, make_delivery):
    """20 requests refused with the same expired JWT share one renewal; a refusal
    sooner than Apple's 20 minutes after the last renewal mints nothing."""
    import asyncio

    from adapters.simulators.apns_sim import ApnsSim

    sim = ApnsSim(profile, token_min_renewal=20 * 60)  # Apple: 429 TooManyProviderTokenUpdates
    await sim.start()
    offset = {"s": -3700.0}
    p = provider_for(sim, clock=lambda: time.time() + offset["s"], token_ttl=10**9)
    try:
        p.bearer_token()  # minted 61 minutes ago: Apple calls it expired
        offset["s"] = -1500.0
        results = await asyncio.gather(*(p.send(make_delivery("push", f"apns:dev{i:02d}")) for i in range(20)))
        assert [r.result for r in results] == [AttemptResult.ACCEPTED] * 20, results
        assert sim.provider_tokens == 1  # one new token (the expired one was never taken)
        outcomes = [row["outcome"] for row in sim.core.ledger]
        assert outcomes.count("ExpiredProviderToken") == 20 and outcomes.count("TooManyProviderTokenUpdates") == 0
        # Apple says expired again right away: renewing now would be too often, so no token
        sim.expire_provider_tokens()
        r = await p.send(make_delivery("push", "apns:dev99"))
        assert r.result == AttemptResult.TRANSIENT_ERROR and r.error == "auth: 403 ExpiredProviderToken"
        assert 1190 <= r.retry_after <= 1200 and sim.provider_tokens == 1
        offset["s"] = 0.0  # 25 minutes later: one renewal is allowed
        assert (await p.send(make_delivery("push", "apns:dev99"))).result == AttemptResult.ACCEPTED
        assert sim.provider_tokens == 2
    finally:
        await p.close()
        await sim.stop()


async def test_410_passes_apples_timestamp_on(apns_sim, make_delivery):
    """The device may be removed only if it was not registered again after the time
    APNs learnt the token was dead: the adapter passes that time on."""
    from pipeline.rules.attempts import after_send

    p = provider_for(apns_sim)
    try:
        apns_sim.unregister("ab12cd", at=1_700_000_000.25)
        d = make_delivery("push", "apns:ab12cd")
        r = await p.send(d)
        assert (r.result, r.permanent_kind, r.error) == (AttemptResult.PERMANENT_ERROR, "bad_token", "410 Unregistered")
        assert r.unregistered_at == 1_700_000_000.25
        assert after_send(d, r.result, time.time(), provider="apns", permanent_kind=r.permanent_kind).remove_device
        before = time.time()
        r2 = await p.send(make_delivery("push", "apns:gone-1"))
        assert before - 1 <= r2.unregistered_at <= time.time() + 1
        apns_sim.register("ab12cd")  # the app was installed again
        assert (await p.send(make_delivery("push", "apns:ab12cd"))).result == AttemptResult.ACCEPTED
    finally:
        await p.close()


async def test_device_token_not_for_topic_is_a_configuration_fault(apns_sim, make_delivery, caplog):
    """A token of another app (our topic is wrong): alert and breaker, the device kept."""
    from adapters.dispatch import Dispatcher
    from pipeline.rules.attempts import after_send

    faults = []
    disp = Dispatcher({"apns": provider_for(apns_sim)}, {"push": ["apns"]}, breaker={"failure_threshold": 3},
                      on_fault=lambda name, r: faults.append((name, r.error)))
    try:
        apns_sim.register("feed01", topic="com.example.other")
        d = make_delivery("push", "apns:feed01")
        [r] = (await disp.send(d)).results
        assert r.result == AttemptResult.TRANSIENT_ERROR and r.fault == "config" and r.permanent_kind is None
        assert r.error == "config: 400 DeviceTokenNotForTopic"
        assert not after_send(d, r.result, time.time(), provider="apns", permanent_kind=r.permanent_kind).remove_device
        assert faults == [("apns", "config: 400 DeviceTokenNotForTopic")]
        for _ in range(2):
            await disp.send(make_delivery("push", "apns:nottopic-2"))
        assert disp.breakers["apns"].state == "open"  # every push would fail the same way
        assert len(faults) == 3
        logged = [r for r in caplog.records if r.levelname == "ERROR" and "configuration fault" in r.getMessage()]
        assert len(logged) == 1  # once a minute per provider and error, not per call
    finally:
        await disp.close()
