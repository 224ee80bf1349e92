"""FCM HTTP v1 adapter against the simulator (OAuth JWT grant + messages:send)."""

from __future__ import annotations

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from adapters.fcm import FcmConfig, FcmProvider
from pipeline.models import AttemptResult


def provider_for(sim, **kw) -> FcmProvider:
    info = sim.service_account()
    info.update(kw.pop("info", {}))
    return FcmProvider(FcmConfig.from_service_account(info, base_url=sim.base_url, timeout=kw.pop("timeout", 2.0), **kw))


async def test_success_with_oauth_token_cached(fcm_sim, make_delivery):
    p = provider_for(fcm_sim)
    try:
        d = make_delivery("push", "fcm:tok-1", {"title": "T", "body": "B", "data": {"order": 42}}, priority="high")
        r = await p.send(d)
        assert r.result == AttemptResult.ACCEPTED, r
        assert r.provider == "fcm" and r.provider_msg_id.startswith(f"projects/{fcm_sim.project_id}/messages/")
        msg = fcm_sim.core.messages[r.provider_msg_id]["message"]
        assert msg["token"] == "tok-1"
        assert msg["notification"] == {"title": "T", "body": "B"}
        assert msg["android"]["priority"] == "HIGH"
        assert msg["data"] == {"notify_id": d.delivery_id, "order": "42"}
        r2 = await p.send(make_delivery("push", "fcm:tok-2"))
        assert r2.result == AttemptResult.ACCEPTED
        assert fcm_sim.core.messages[r2.provider_msg_id]["message"]["android"]["priority"] == "NORMAL"
        assert p.token_fetches == 1 and fcm_sim.token_grants == 1
    finally:
        await p.close()


def test_assertion_is_a_google_jwt_grant(fcm_sim):
    p = provider_for(fcm_sim)
    a = p.assertion()
    claims = jwt.decode(a, options={"verify_signature": False})
    assert claims["iss"] == fcm_sim.client_email
    assert claims["aud"] == fcm_sim.token_uri
    assert claims["scope"] == "https://www.googleapis.com/auth/firebase.messaging"
    assert claims["exp"] - claims["iat"] == 3600
    assert jwt.get_unverified_header(a) == {"alg": "RS256", "typ": "JWT", "kid": fcm_sim.private_key_id}


@pytest.mark.parametrize("token,code", [("bad-1", "INVALID_ARGUMENT"), ("gone-1", "UNREGISTERED")])
async def test_token_errors_are_bad_token(fcm_sim, make_delivery, token, code):
    p = provider_for(fcm_sim)
    try:
        r = await p.send(make_delivery("push", f"fcm:{token}"))
        assert r.result == AttemptResult.PERMANENT_ERROR and r.permanent_kind == "bad_token"
        assert code in r.error
    finally:
        await p.close()


async def test_5xx_transient_and_429_retry_after(fcm_sim, make_delivery):
    p = provider_for(fcm_sim)
    try:
        r = await p.send(make_delivery("push", "fcm:error-1"))
        assert r.result == AttemptResult.TRANSIENT_ERROR and "INTERNAL" in r.error
        d = make_delivery("push", "fcm:throttle-1")
        r = await p.send(d)
        assert r.result == AttemptResult.RATE_LIMITED and r.retry_after == 1.0
        assert (await p.send(d)).result == AttemptResult.ACCEPTED
    finally:
        await p.close()


async def test_revoked_access_token_is_renewed_once(fcm_sim, make_delivery):
    p = provider_for(fcm_sim)
    try:
        assert (await p.send(make_delivery("push", "fcm:a"))).result == AttemptResult.ACCEPTED
        fcm_sim.expire_tokens()
        r = await p.send(make_delivery("push", "fcm:b"))
        assert r.result == AttemptResult.ACCEPTED, r
        assert fcm_sim.token_grants == 2
    finally:
        await p.close()


async def test_wrong_service_account_key_is_auth_failure(fcm_sim, make_delivery):
    pem = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    p = provider_for(fcm_sim, info={"private_key": pem.decode()})
    try:
        r = await p.send(make_delivery("push", "fcm:a"))
        assert r.result == AttemptResult.TRANSIENT_ERROR and r.error.startswith("auth: oauth token: 400 invalid_grant")
        assert [row for row in fcm_sim.core.ledger if row["op"] == "send"] == []  # nothing was sent
    finally:
        await p.close()


async def test_timeout_after_accept_is_unknown(fcm_sim, make_delivery):
    p = provider_for(fcm_sim, timeout=0.3)
    try:
        d = make_delivery("push", "fcm:hang-1")
        r = await p.send(d)
        assert r.result == AttemptResult.TIMEOUT_UNKNOWN
        assert fcm_sim.core.by_key[d.delivery_id]  # it was accepted
        q = await p.query(d.delivery_id)
        assert q.supported is False
    finally:
        await p.close()
