"""FCM HTTP v1 adapter against the simulator (OAuth JWT grant + messages:send)."""

from __future__ import annotations

import httpx
import jwt
import orjson
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
        assert msg["data"] == {"notify_id": d.delivery_id, "order": "42"}  # JSON text of 42
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


def test_the_key_is_loaded_once_and_signs_every_assertion(fcm_sim):
    """The RSA key is parsed and checked when the adapter is built, not per assertion
    (about 50 ms on the event loop each): every assertion verifies with the
    service account's public key."""
    from adapters._token import load_private_key

    p = provider_for(fcm_sim)
    assert isinstance(p._signing_key, rsa.RSAPrivateKey)
    # one load per process: the registry's check of the key gets the same object
    assert load_private_key(fcm_sim.private_key_pem) is p._signing_key
    public = serialization.load_pem_private_key(fcm_sim.private_key_pem.encode(), None).public_key()
    for _ in range(2):
        claims = jwt.decode(p.assertion(), public, algorithms=["RS256"], audience=fcm_sim.token_uri)
        assert claims["iss"] == fcm_sim.client_email


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


# ------------------------------------------------------------------ issue 28: as firebase-admin builds it


DATA = {"s": "text", "flag": True, "n": 1.5, "none": None, "obj": {"a": 1}, "list": [1, "b"]}


async def test_data_values_are_json_strings_that_firebase_admin_accepts(fcm_sim, make_delivery):
    """firebase-admin (the judge) refuses non-string data values; ours are strings:
    a string as it is, anything else its JSON text (never Python's str())."""
    from firebase_admin import _messaging_encoder, messaging

    with pytest.raises(ValueError, match="non-string"):  # what the judge says of the values as given
        _messaging_encoder.MessageEncoder().default(messaging.Message(token="t", data=DATA))
    p = provider_for(fcm_sim)
    try:
        d = make_delivery("push", "fcm:tok-data", {"title": "T", "body": "B", "data": DATA})
        ours = p.build_message(d)["message"]
        assert ours["data"] == {"notify_id": d.delivery_id, "s": "text", "flag": "true", "n": "1.5", "none": "null",
                                "obj": '{"a":1}', "list": '[1,"b"]'}
        judged = _messaging_encoder.MessageEncoder().default(messaging.Message(
            token=ours["token"], data=ours["data"],
            notification=messaging.Notification(title="T", body="B")))
        assert judged["data"] == ours["data"] and judged["notification"] == ours["notification"]
        assert {k: orjson.loads(v) for k, v in ours["data"].items() if k not in ("s", "notify_id")} == {
            k: v for k, v in DATA.items() if k != "s"}
        r = await p.send(d)  # the simulator refuses non-strings, as FCM does
        assert r.result == AttemptResult.ACCEPTED, r
    finally:
        await p.close()


async def test_simulator_refuses_non_string_data_like_fcm(fcm_sim, make_delivery):
    p = provider_for(fcm_sim)
    try:
        token = await p.access_token()
        async with httpx.AsyncClient(base_url=fcm_sim.base_url) as c:
            resp = await c.post(f"/v1/projects/{fcm_sim.project_id}/messages:send",
                                headers={"authorization": f"Bearer {token}"},
                                json={"message": {"token": "t1", "data": {"a": "1", "b": True}}})
        assert resp.status_code == 400
        assert resp.json()["error"]["message"] == "Invalid value at 'message.data[1].value' (TYPE_STRING)"
    finally:
        await p.close()


async def test_third_party_auth_error_is_a_configuration_fault_no_refresh_no_resend(fcm_sim, make_delivery):
    """401 THIRD_PARTY_AUTH_ERROR is the Firebase project's APNs credential, not our
    access token: no new OAuth grant, no second call, a configuration fault."""
    p = provider_for(fcm_sim)
    try:
        assert (await p.send(make_delivery("push", "fcm:android-1"))).result == AttemptResult.ACCEPTED
        d = make_delivery("push", "fcm:tpauth-ios-1")
        r = await p.send(d)
        assert r.result == AttemptResult.TRANSIENT_ERROR and r.fault == "config" and r.permanent_kind is None
        assert r.error.startswith("config: 401 THIRD_PARTY_AUTH_ERROR"), r.error
        assert fcm_sim.core.calls(d.delivery_id) == 1  # no resend
        assert p.token_fetches == 1 and fcm_sim.token_grants == 1  # no refresh
        fcm_sim.third_party_auth_broken = True  # the whole project: still one call each
        r2 = await p.send(make_delivery("push", "fcm:android-2"))
        assert r2.fault == "config" and fcm_sim.token_grants == 1
    finally:
        await p.close()
