"""Huawei Push Kit adapter against its simulator on 127.0.0.1 (OAuth client
credentials + messages:send), the registry's kind "hms", and the dispatcher
picking it by the device's platform."""

from __future__ import annotations

import asyncio

import httpx
import orjson
import pytest

from adapters.dispatch import Dispatcher
from adapters.fake import FakeProvider
from adapters.hms import HmsConfig, HmsProvider, hms_outcome, illegal_tokens
from adapters.receipts import (HMS_CALLBACK_HEADER, ReceiptRejected, ReceiptVerifier, hms_receipt_config,
                               parse_hms_callback_id, parse_hms_receipts)
from adapters.registry import build_spec, check_all
from adapters.simulators import SimProfile
from adapters.simulators.hms_sim import HmsSim
from config.settings import load_settings
from pipeline.models import AttemptResult
from pipeline.parsers.events import InvalidEvent, address_ok, parse_device_update
from tests.adapters.helpers import ReceiptServer, notify_toml


@pytest.fixture
async def hms_sim(profile):
    sim = HmsSim(profile)
    await sim.start()
    yield sim
    await sim.stop()


def provider_for(sim: HmsSim, **kw) -> HmsProvider:
    creds = {**sim.credentials(), **kw.pop("creds", {})}
    return HmsProvider(HmsConfig(**creds, base_url=sim.base_url, token_url=sim.token_url,
                                 timeout=kw.pop("timeout", 2.0), **kw))


def sends(sim: HmsSim) -> list[dict]:
    return [r for r in sim.core.ledger if r["op"] == "send"]


async def test_send_ok_with_the_oauth_token_cached(hms_sim, make_delivery):
    p = provider_for(hms_sim)
    try:
        d = make_delivery("push", "hms:tok-1", {"title": "T", "body": "B", "data": {"order": 42}}, priority="high")
        r = await p.send(d)
        assert r.result == AttemptResult.ACCEPTED, r
        assert r.provider == "hms" and r.provider_msg_id in hms_sim.core.messages
        msg = hms_sim.core.messages[r.provider_msg_id]["message"]
        assert msg["token"] == ["tok-1"]
        assert msg["android"]["notification"] == {"title": "T", "body": "B", "click_action": {"type": 3}}
        assert msg["android"]["urgency"] == "HIGH" and msg["android"]["bi_tag"] == d.delivery_id
        assert orjson.loads(msg["data"]) == {"notify_id": d.delivery_id, "order": 42}  # one JSON string
        assert hms_sim.core.by_key[d.delivery_id] == r.provider_msg_id
        r2 = await p.send(make_delivery("push", "hms:tok-2"))
        assert r2.result == AttemptResult.ACCEPTED
        assert hms_sim.core.messages[r2.provider_msg_id]["message"]["android"]["urgency"] == "NORMAL"
        assert p.token_fetches == 1 and hms_sim.token_grants == 1
        assert (await p.query(d.delivery_id)).supported is False
    finally:
        await p.close()


async def test_concurrent_senders_share_one_token_fetch(hms_sim, make_delivery):
    p = provider_for(hms_sim)
    try:
        rs = await asyncio.gather(*(p.send(make_delivery("push", f"hms:c{i}")) for i in range(20)))
        assert {r.result for r in rs} == {AttemptResult.ACCEPTED}
        assert p.token_fetches == 1 and hms_sim.token_grants == 1
    finally:
        await p.close()


async def test_invalid_token_is_a_bad_token_so_the_device_goes(hms_sim, make_delivery):
    hms_sim.invalid_tokens.add("tok-uninstalled")
    p = provider_for(hms_sim)
    try:
        for address in ("hms:tok-uninstalled", "hms:bad-1", "hms:gone-2"):
            r = await p.send(make_delivery("push", address))
            assert (r.result, r.permanent_kind) == (AttemptResult.PERMANENT_ERROR, "bad_token"), r
            assert "80300007" in r.error
        assert len(sends(hms_sim)) == 3
    finally:
        await p.close()


async def test_expired_oauth_token_is_renewed_once_and_the_call_made_again(hms_sim, make_delivery):
    p = provider_for(hms_sim)
    try:
        assert (await p.send(make_delivery("push", "hms:a"))).result == AttemptResult.ACCEPTED
        hms_sim.expire_tokens()  # our cached token still looks valid to us: Push Kit says 80200003
        d = make_delivery("push", "hms:b")
        r = await p.send(d)
        assert r.result == AttemptResult.ACCEPTED, r
        assert hms_sim.token_grants == 2 and p.token_fetches == 2
        assert [(row["status"], row["outcome"]) for row in sends(hms_sim) if row["key"] == d.delivery_id] == [
            (401, "80200003"), (200, "accepted")]
    finally:
        await p.close()


async def test_senders_refused_with_the_same_expired_token_share_one_renewal(hms_sim, make_delivery):
    p = provider_for(hms_sim)
    try:
        assert (await p.send(make_delivery("push", "hms:a"))).result == AttemptResult.ACCEPTED
        hms_sim.expire_tokens()
        rs = await asyncio.gather(*(p.send(make_delivery("push", f"hms:r{i}")) for i in range(10)))
        assert {r.result for r in rs} == {AttemptResult.ACCEPTED}
        assert hms_sim.token_grants == 2  # one renewal for the ten refusals
    finally:
        await p.close()


async def test_a_token_refused_again_after_renewal_is_auth_transient_after_one_retry(profile, make_delivery):
    sim = HmsSim(profile, token_lifetime=0)  # every token it issues has expired already
    await sim.start()
    p = provider_for(sim)
    try:
        d = make_delivery("push", "hms:c")
        r = await p.send(d)
        assert r.result == AttemptResult.TRANSIENT_ERROR and r.error.startswith("auth: 401 80200003"), r
        assert r.fault is None
        assert sim.core.calls(d.delivery_id) == 2 and sim.token_grants == 2  # one renewal, one retry
    finally:
        await p.close()
        await sim.stop()


async def test_wrong_client_secret_sends_nothing(hms_sim, make_delivery):
    p = provider_for(hms_sim, creds={"client_secret": "0" * 64})
    try:
        r = await p.send(make_delivery("push", "hms:a"))
        assert r.result == AttemptResult.TRANSIENT_ERROR and r.error.startswith("auth: oauth token: 401 invalid client")
        assert sends(hms_sim) == []
    finally:
        await p.close()


async def test_wrong_app_id_is_a_config_fault(hms_sim, make_delivery):
    p = provider_for(hms_sim, creds={"app_id": "999"})
    try:
        r = await p.send(make_delivery("push", "hms:a"))
        assert (r.result, r.fault) == (AttemptResult.TRANSIENT_ERROR, "config") and "80300002" in r.error
        assert r.permanent_kind is None  # the device is kept
    finally:
        await p.close()


async def test_429_is_rate_limited_with_retry_after(hms_sim, make_delivery):
    p = provider_for(hms_sim)
    try:
        d = make_delivery("push", "hms:throttle-1")
        r = await p.send(d)
        assert (r.result, r.retry_after) == (AttemptResult.RATE_LIMITED, 1.0), r
        assert (await p.send(d)).result == AttemptResult.ACCEPTED
        hms_sim.core.set_mode({"mode": "ratelimit", "retry_after": 7, "count": 1})
        r = await p.send(make_delivery("push", "hms:q"))
        assert (r.result, r.retry_after) == (AttemptResult.RATE_LIMITED, 7.0) and r.error.startswith("429"), r
    finally:
        await p.close()


async def test_5xx_flow_control_and_internal_error_are_transient(hms_sim, make_delivery):
    p = provider_for(hms_sim)
    try:
        r = await p.send(make_delivery("push", "hms:error-1"))
        assert r.result == AttemptResult.TRANSIENT_ERROR and "81000001" in r.error
        hms_sim.core.set_mode({"mode": "down", "count": 1})
        r = await p.send(make_delivery("push", "hms:x"))
        assert r.result == AttemptResult.TRANSIENT_ERROR and r.error.startswith("503"), r
    finally:
        await p.close()


async def test_timeout_after_accept_is_unknown(hms_sim, make_delivery):
    p = provider_for(hms_sim, timeout=0.3)
    try:
        d = make_delivery("push", "hms:hang-1")
        r = await p.send(d)
        assert r.result == AttemptResult.TIMEOUT_UNKNOWN, r
        assert hms_sim.core.by_key[d.delivery_id]  # it was accepted
    finally:
        await p.close()


async def test_too_large_is_invalid_request_and_other_platforms_are_refused(hms_sim, make_delivery):
    p = provider_for(hms_sim)
    try:
        r = await p.send(make_delivery("push", "hms:big", {"title": "T", "body": "x" * 5000}))
        assert (r.result, r.permanent_kind) == (AttemptResult.PERMANENT_ERROR, "invalid_request") and "80300008" in r.error
        # an APNs token that reached it (a route without an APNs provider): refused, the device kept
        r = await p.send(make_delivery("push", "apns:" + "a1" * 32))
        assert (r.result, r.permanent_kind) == (AttemptResult.PERMANENT_ERROR, "rejected")
        assert len(sends(hms_sim)) == 1
    finally:
        await p.close()


async def test_simulator_speaks_push_kit(hms_sim):
    """The wire format as Push Kit's: a map as ``data`` is refused, partial success names
    the invalid tokens, validate_only delivers nothing."""
    p = provider_for(hms_sim)
    try:
        bearer = await p.access_token()
        auth = {"authorization": f"Bearer {bearer}"}
        path = f"/v1/{hms_sim.app_id}/messages:send"
        hms_sim.invalid_tokens.add("t-bad")
        async with httpx.AsyncClient(base_url=hms_sim.base_url) as c:
            resp = await c.post(path, headers=auth, json={"message": {"token": ["t1"], "data": {"a": 1}}})
            assert (resp.status_code, resp.json()["code"]) == (400, "80100003")
            resp = await c.post(path, headers=auth, json={"validate_only": False, "message": {
                "token": ["t1", "t-bad"], "android": {"notification": {"title": "a", "body": "b",
                                                                        "click_action": {"type": 3}}}}})
            body = resp.json()
            assert (resp.status_code, body["code"]) == (200, "80100000")
            assert illegal_tokens(body["msg"]) == ["t-bad"] and body["requestId"]
            assert hms_outcome(200, body, "t-bad")[:2] == (AttemptResult.PERMANENT_ERROR, "bad_token")
            assert hms_outcome(200, body, "t1")[0] == AttemptResult.ACCEPTED
            resp = await c.post(path, headers=auth, json={"validate_only": True, "message": {"token": ["t2"]}})
            assert resp.json()["code"] == "80000000"
            resp = await c.post(path, headers={"authorization": "Bearer nope"}, json={"message": {"token": ["t"]}})
            assert (resp.status_code, resp.json()["code"]) == (401, "80200001")
        assert [r["op"] for r in hms_sim.core.ledger if r["op"] != "oauth"] == ["send", "send", "validate", "send"]
    finally:
        await p.close()


def test_receipts_parse_by_request_id():
    body = {"statuses": [
        {"biTag": "n_1.push", "appid": "104857601", "token": "t1", "status": 0, "timestamp": 1563106160960,
         "requestId": "156310615953015000000"},
        {"biTag": "n_2.push", "appid": "104857601", "token": "t2", "status": 2, "timestamp": 1563106160960,
         "requestId": "156310615953015000001"},
        {"biTag": "n_3.push", "status": 27, "requestId": "156310615953015000002"}]}
    got = parse_hms_receipts(orjson.dumps(body))
    assert [(r.provider, r.provider_msg_id, r.status, r.at, r.error) for r in got] == [
        ("hms", "156310615953015000000", "DELIVERED", 1563106160.96, None),
        ("hms", "156310615953015000001", "UNDELIVERED", 1563106160.96, "hms 2: app not installed")]
    with pytest.raises(ReceiptRejected) as exc:
        parse_hms_receipts({"statuses": [{"status": 0}]})
    assert exc.value.field == "statuses[0].requestId"


# ------------------------------------------------------------------ platform, config, dispatch


def test_devices_register_with_the_hms_platform():
    upd = parse_device_update({"user_id": "u1", "token": "IQAAAACy0kYk_hms-token", "platform": "hms"})
    assert upd.platform == "hms" and address_ok("push", f"hms:{upd.token}")
    with pytest.raises(InvalidEvent):
        parse_device_update({"user_id": "u1", "token": "t", "platform": "mipush"})


def hms_config(sim: HmsSim, tmp_path, name: str = "huawei") -> str:
    return notify_toml(tmp_path, f"""
[providers.{name}]
kind = "hms"
client_id = "{sim.client_id}"
client_secret_env = "TEST_HMS_CLIENT_SECRET"
base_url = "{sim.base_url}"
token_url = "{sim.token_url}"
timeout = 5

[providers.ios]
kind = "fake"
channel = "push"

[providers.android]
kind = "fake"
channel = "push"

[routes]
push = ["ios", "android", "{name}"]
sms = []
email = []
webhook = []
""")


async def test_kind_hms_builds_tries_its_oauth_and_takes_hms_tokens(hms_sim, tmp_path, make_delivery):
    s = load_settings(hms_config(hms_sim, tmp_path), env={})
    env = {"TEST_HMS_CLIENT_SECRET": hms_sim.client_secret}
    p = build_spec(s.providers["huawei"], env)
    try:
        assert isinstance(p, HmsProvider) and p.platform == "hms" and p.name == "huawei"
        assert p.config.send_path == f"/v1/{hms_sim.client_id}/messages:send"  # app_id: the client id
    finally:
        await p.close()
    lines = {line.name: line for line in await check_all(s.providers, s.routes, env, timeout=5)}
    assert lines["huawei"].ok and "validate_only" in lines["huawei"].message, lines["huawei"]
    assert [r["op"] for r in hms_sim.core.ledger] == ["oauth", "validate"]  # nothing sent
    lines = {line.name: line for line in await check_all(s.providers, s.routes,
                                                         {"TEST_HMS_CLIENT_SECRET": "wrong"}, timeout=5)}
    assert not lines["huawei"].ok and "invalid client_secret" in lines["huawei"].message

    # the dispatcher: a device's platform picks the provider, whatever the providers are called
    apns, fcm = FakeProvider("ios", "push"), FakeProvider("android", "push")
    apns.platform, fcm.platform = "apns", "fcm"  # type: ignore[attr-defined]
    hms = build_spec(s.providers["huawei"], env)
    disp = Dispatcher({"ios": apns, "android": fcm, "huawei": hms}, s.routes)
    try:
        rounds = {a: await disp.send(make_delivery("push", a)) for a in ("hms:tok-h", "apns:" + "c3" * 32, "fcm:tok-f")}
        picked = {a: [(r.provider, r.result) for r in rnd.results] for a, rnd in rounds.items()}
        assert picked == {"hms:tok-h": [("huawei", "ACCEPTED")], "apns:" + "c3" * 32: [("ios", "ACCEPTED")],
                          "fcm:tok-f": [("android", "ACCEPTED")]}
        assert len(sends(hms_sim)) == 1
    finally:
        await disp.close()


def test_a_secret_written_in_the_file_is_refused(tmp_path):
    from config.settings import ConfigError

    path = tmp_path / "n.toml"
    path.write_text('[providers.h]\nkind = "hms"\nclient_id = "1"\nclient_secret = "s3cr3t"\n')
    with pytest.raises(ConfigError) as exc:
        load_settings(str(path), env={})
    assert "client_secret_env" in str(exc.value) and "s3cr3t" not in str(exc.value)
    path.write_text('[providers.h]\nkind = "hms"\nclient_id = "1"\n')
    with pytest.raises(ConfigError, match="client_secret_env / client_secret_file"):
        load_settings(str(path), env={})


def test_profile_default_is_realistic():
    """The standalone simulators run Push Kit's with the same latency profile as the others."""
    assert HmsSim().core.profile == SimProfile.realistic()


# ------------------------------------------------------------------ receipts: the simulator's callbacks, the settings


class _HmsReceipts(ReceiptServer):
    """Push Kit's receipt callbacks, verified with the simulator's callback user name and key."""

    def __init__(self, username: str, key: str) -> None:
        super().__init__()
        self.verifier = ReceiptVerifier(hms_username=username, hms_key=key, hms_provider="huawei")

    async def verify(self, provider, request, body):
        return await self.verifier.hms(body, request.headers.get(HMS_CALLBACK_HEADER))


async def test_the_simulator_posts_authenticated_receipts_matched_by_request_id(profile, make_delivery):
    sim = HmsSim(profile, receipt_key="k-" + "9" * 30)
    server = _HmsReceipts(sim.receipt_username, sim.receipt_key)
    await server.start()
    sim.receipts_url = server.base_url + "/huawei"
    await sim.start()
    try:
        ok = await server.send_one(provider_for(sim), make_delivery("push", "hms:tok-r1"))
        lost = await server.send_one(provider_for(sim), make_delivery(
            "push", "hms:tok-r2", {"title": "T", "body": "gone #sim=undelivered"}))
        got = {r.provider_msg_id: (r.provider, r.status, r.error) for r in server.receipts}
        assert got == {ok.provider_msg_id: ("huawei", "DELIVERED", None),
                       lost.provider_msg_id: ("huawei", "UNDELIVERED", "hms 2: app not installed")}
        _provider, body, headers = server.raw[0]
        doc = orjson.loads(body)["statuses"][0]
        # the receipt carries our delivery id as its biTag, and the request id the send answered
        assert doc["biTag"] == sends(sim)[0]["key"] and doc["requestId"] == ok.provider_msg_id
        assert parse_hms_callback_id(headers[HMS_CALLBACK_HEADER]) is not None
        assert server.answers == [200, 200] and [r["status"] for r in sim.core.receipts] == [200, 200]
        # another key: the same callbacks are refused
        server.verifier = ReceiptVerifier(hms_username=sim.receipt_username, hms_key="another-key")
        with pytest.raises(ReceiptRejected) as exc:
            await server.verifier.hms(body, headers[HMS_CALLBACK_HEADER])
        assert exc.value.reason == "bad_signature"
    finally:
        await sim.stop()
        await server.stop()


def _receipt_table(extra: str) -> str:
    return f'[providers.h]\nkind = "hms"\nclient_id = "1"\nclient_secret_env = "S"\n{extra}'


def test_receipt_callback_settings_by_reference_only(tmp_path):
    from config.settings import ConfigError

    path = tmp_path / "n.toml"
    for inline in ('receipt_key = "cb-k3y-value"', 'receipt_password = "cb-k3y-value"'):
        path.write_text(_receipt_table(f'receipt_username = "notify"\n{inline}\n'))
        with pytest.raises(ConfigError) as exc:
            load_settings(str(path), env={})
        assert "cb-k3y-value" not in str(exc.value) and "never written in the config file" in str(exc.value)
    path.write_text(_receipt_table('receipt_key_env = "cb-k3y-value"\nreceipt_username = "notify"\n'))
    with pytest.raises(ConfigError) as exc:  # the secret pasted where its variable's name goes
        load_settings(str(path), env={})
    assert "cb-k3y-value" not in str(exc.value)
    # Push Kit authenticates receipts with both or sends no header: one alone is refused
    path.write_text(_receipt_table('receipt_username = "notify"\n'))
    with pytest.raises(ConfigError, match="receipt_key_env / receipt_key_file"):
        load_settings(str(path), env={})
    path.write_text(_receipt_table('receipt_key_env = "HMS_RECEIPT_KEY"\n'))
    with pytest.raises(ConfigError, match="missing receipt_username"):
        load_settings(str(path), env={})

    path.write_text(_receipt_table('receipt_username = "notify"\nreceipt_key_env = "HMS_RECEIPT_KEY"\n'))
    s = load_settings(str(path), env={})
    spec = s.providers["h"]
    assert spec.options["receipt_username"] == "notify"
    assert hms_receipt_config(s.providers, "h", env={"HMS_RECEIPT_KEY": "k"}) == {
        "hms_username": "notify", "hms_key": "k", "hms_provider": "h"}
    with pytest.raises(ConfigError) as exc:  # the key's variable unset: named, for the API's log
        hms_receipt_config(s.providers, "h", env={})
    assert "providers.h.receipt_key_env" in str(exc.value)
    assert hms_receipt_config(s.providers, "other", env={}) is None
    # the worker builds the adapter from the same table (the receipt settings are the API's)
    p = build_spec(spec, {"S": "secret"})
    assert isinstance(p, HmsProvider) and p.config.receipt_username == "notify"
    # the simulators' "hms" of notify run, by NOTIFY_HMS_RECEIPT_KEY, when no table of that name has a kind
    assert hms_receipt_config({}, "hms", simulator_key="sim-k") == {
        "hms_username": "notify-sim", "hms_key": "sim-k", "hms_provider": "hms"}
    assert hms_receipt_config({}, "hms") is None
