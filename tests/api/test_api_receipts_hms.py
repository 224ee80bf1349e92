"""POST /v1/receipts/<name> for Huawei Push Kit (issue 20 item 6): a provider of kind
hms takes Push Kit's receipt callbacks (``{"statuses": [...]}``) authenticated by
``X-HUAWEI-CALLBACK-ID`` with its receipt configuration's callback user name and key
(``receipt_username``, ``receipt_key_env``); the receipts carry the provider's name and
the request id the send answered. On real servers: the API on 127.0.0.1, the
session's Redis, the Push Kit simulator posting its receipts to the API, and, for the
record, a worker process matching them."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestServer

from adapters.receipts import HMS_CALLBACK_HEADER, hms_callback_id
from adapters.registry import build_spec
from adapters.simulators import SimProfile
from adapters.simulators.hms_sim import HmsSim
from config.settings import load_settings
from pipeline.api import make_app
from pipeline.ids import delivery_id, device_delivery_id
from tests.adapters.conftest import make_delivery  # noqa: F401 (the fixture)
from tests.api.conftest import BOOTSTRAP, PARTITIONS, make_keys
from tests.api.test_api_receipts import receipts, rejected
from tests.pipeline.harness import Pipeline, push_event

SECRET_ENV, KEY_ENV = "TEST_HMS_CLIENT_SECRET", "TEST_HMS_RECEIPT_KEY"


def hms_toml(sim: HmsSim, name: str = "huawei", receipts: bool = True) -> str:
    text = f"""
[providers.{name}]
kind = "hms"
client_id = "{sim.client_id}"
client_secret_env = "{SECRET_ENV}"
base_url = "{sim.base_url}"
token_url = "{sim.token_url}"
timeout = 5
"""
    if receipts:
        text += f'receipt_username = "{sim.receipt_username}"\nreceipt_key_env = "{KEY_ENV}"\n'
    return text


async def serve_api(settings, redis_url, tmp_path, **kw):
    keys_path = tmp_path / "api_keys.json"
    make_keys(keys_path)
    app = make_app(settings, broker_url=redis_url, store_path=settings.db_path, keys_path=str(keys_path),
                   bootstrap_key=BOOTSTRAP, **kw)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server, str(server.make_url("")).rstrip("/")


@pytest.fixture
async def world(redis_url, tmp_path, monkeypatch):
    sim = HmsSim(SimProfile.clean(receipt_delay=(0.0, 0.05)), receipt_key="cb-" + "7" * 32)
    await sim.start()
    monkeypatch.setenv(KEY_ENV, sim.receipt_key)  # the API reads the callback key from its environment
    (tmp_path / "notify.toml").write_text(
        hms_toml(sim) + hms_toml(sim, "bare", receipts=False)
        + hms_toml(sim, "unset").replace(KEY_ENV, "TEST_HMS_RECEIPT_KEY_UNSET"))
    settings = dataclasses.replace(load_settings(str(tmp_path / "notify.toml"), env={}), partitions=PARTITIONS,
                                   data_dir=str(tmp_path / "data"), db_path=str(tmp_path / "records.db"))
    server, url = await serve_api(settings, redis_url, tmp_path)
    sim.receipts_url = url + "/v1/receipts/huawei"
    # the adapter as a worker builds it from the same table
    provider = build_spec(settings.providers["huawei"], {SECRET_ENV: sim.client_secret})
    async with aiohttp.ClientSession() as http:
        yield sim, provider, url, http
    await provider.close()
    await server.close()
    await sim.stop()


async def _wait(pred, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def post(http, url, body: bytes, headers: dict) -> tuple[int, dict, str]:
    async with http.post(url, data=body, headers=headers) as resp:
        text = await resp.text()
        return resp.status, orjson.loads(text), text


async def test_push_kit_receipts_under_the_providers_name(world, redis_url, make_delivery):
    sim, provider, url, http = world
    ok = await provider.send(make_delivery("push", "hms:tok-ok-" + "a" * 20))
    lost = await provider.send(make_delivery("push", "hms:tok-lost-" + "b" * 20,
                                             {"title": "T", "body": "on its way #sim=undelivered"}))
    assert ok.result == lost.result == "ACCEPTED" and ok.provider_msg_id != lost.provider_msg_id
    await _wait(lambda: len(receipts(redis_url)) >= 2)
    got = {k: (r["provider"], r["provider_msg_id"], r["status"], r.get("error")) for k, r in receipts(redis_url)}
    assert got == {ok.provider_msg_id: ("huawei", ok.provider_msg_id, "DELIVERED", None),
                   lost.provider_msg_id: ("huawei", lost.provider_msg_id, "UNDELIVERED", "hms 2: app not installed")}
    assert [r["status"] for r in sim.core.receipts] == [200, 200]
    assert len(receipts(redis_url)) == 2


async def test_wrong_or_missing_credentials_are_401_and_nothing_is_written(world, redis_url):
    sim, _provider, url, http = world
    body = sim.receipt_body("1563106159530150000001", 0, tokens=["tok-x"], bi_tag="n_x.push")
    now_ms = str(int(time.time() * 1000))
    before = rejected("huawei", "bad_signature")
    for headers in (
        {},  # no X-HUAWEI-CALLBACK-ID
        {HMS_CALLBACK_HEADER: ""},
        {HMS_CALLBACK_HEADER: hms_callback_id("not-the-key", sim.receipt_username)},
        {HMS_CALLBACK_HEADER: hms_callback_id(sim.receipt_key, "someone-else")},
        # the value of another timestamp: the header's fields are what is signed
        {HMS_CALLBACK_HEADER: hms_callback_id(sim.receipt_key, sim.receipt_username, timestamp=now_ms)
         .replace(f"timestamp={now_ms}", f"timestamp={int(now_ms) + 1}")},
        {HMS_CALLBACK_HEADER: "timestamp=1; nonce=x; value=" + "A" * 44},
    ):
        status, doc, text = await post(http, url + "/v1/receipts/huawei", body,
                                       {"Content-Type": "application/json", **headers})
        assert status == 401 and doc["error"]["code"] == "bad_signature", (headers, doc)
        # nothing of the request echoed: neither the header nor the body
        assert "value=" not in text and "tok-x" not in text and sim.receipt_username not in text
    assert rejected("huawei", "bad_signature") == before + 6
    stale = sim.signed(timestamp=str(int((time.time() - 3600) * 1000)))
    status, doc, _ = await post(http, url + "/v1/receipts/huawei", body, stale)
    assert status == 401 and doc["error"]["code"] == "stale"
    # a provider of kind hms without receipt credentials takes none
    status, doc, _ = await post(http, url + "/v1/receipts/bare", body, sim.signed())
    assert status == 401 and doc["error"]["code"] == "bad_signature"
    assert receipts(redis_url) == []


async def test_replayed_callbacks_are_written_once(world, redis_url):
    sim, _provider, url, http = world
    body = sim.receipt_body("1563106159530150000002", 0, tokens=["tok-y"], bi_tag="n_y.push")
    headers = sim.signed()
    status, doc, _ = await post(http, url + "/v1/receipts/huawei", body, headers)
    assert status == 200 and doc == {"received": 1}
    # the same callback again (Push Kit's retry), and the same body under a new header: acknowledged, not written
    for again in (headers, sim.signed()):
        status, doc, _ = await post(http, url + "/v1/receipts/huawei", body, again)
        assert status == 200 and doc == {"received": 0}
    # the header does not cover the body: one header is taken once, not with another body
    before = rejected("huawei", "replay")
    other = sim.receipt_body("1563106159530150000003", 0, tokens=["tok-z"])
    status, doc, _ = await post(http, url + "/v1/receipts/huawei", other, headers)
    assert status == 401 and doc["error"]["code"] == "replay"
    assert rejected("huawei", "replay") == before + 1
    assert [k for k, _r in receipts(redis_url)] == ["1563106159530150000002"]
    # a status still cached on the device (27) is not final: acknowledged, nothing written
    status, doc, _ = await post(http, url + "/v1/receipts/huawei",
                                sim.receipt_body("1563106159530150000004", 27, tokens=["tok-w"]), sim.signed())
    assert status == 200 and doc == {"received": 0}
    assert len(receipts(redis_url)) == 1


async def test_malformed_unknown_and_unreadable_key(world, redis_url):
    sim, _provider, url, http = world
    for body, field in ((b"not json", None), (b'{"statuses": 5}', "statuses"),
                        (b'{"statuses": [{"status": 0}]}', "statuses[0].requestId"),
                        (orjson.dumps({"statuses": [{"requestId": "r\n1", "status": 0}]}), "statuses[0].requestId")):
        status, doc, _ = await post(http, url + "/v1/receipts/huawei", body, sim.signed())
        assert status == 400 and doc["error"]["code"] == "malformed", doc
        if field:
            assert doc["error"]["field"] == field
    # the callback key's variable is not set: ours to fix, 503 (Push Kit retries), the variable not named
    status, doc, text = await post(http, url + "/v1/receipts/unset", sim.receipt_body("r-1"), sim.signed())
    assert status == 503 and doc["error"]["code"] == "receipts_unavailable" and "TEST_HMS" not in text
    # not a provider of the config, and no simulator key: 404
    status, doc, _ = await post(http, url + "/v1/receipts/hms", sim.receipt_body("r-1"), sim.signed())
    assert status == 404 and doc["error"]["code"] == "unknown_provider"
    assert receipts(redis_url) == []
    async with http.get(url + "/v1/openapi.json") as resp:
        spec = await resp.json()
    post_receipt = spec["paths"]["/v1/receipts/{provider}"]["post"]
    enum = post_receipt["parameters"][0]["schema"]["enum"]
    assert {"huawei", "bare", "unset"} <= set(enum) and "hms" not in enum
    assert HMS_CALLBACK_HEADER in [p["name"] for p in post_receipt["parameters"]]


async def test_the_simulators_of_notify_run_by_their_key(redis_url, tmp_path, make_delivery):
    """``notify run`` with the simulators: NOTIFY_HMS_RECEIPT_KEY is shared by the Push
    Kit simulator and the API, whose /v1/receipts/hms takes them (no [providers.hms])."""
    from adapters.simulators import start_all

    settings = dataclasses.replace(load_settings(env={}), partitions=PARTITIONS, data_dir=str(tmp_path / "data"),
                                   db_path=str(tmp_path / "records.db"))
    server, url = await serve_api(settings, redis_url, tmp_path, hms_receipt_key="sim-" + "5" * 32)
    sims = await start_all(url + "/v1/receipts", profile=SimProfile.clean(receipt_delay=(0.0, 0.05)),
                           hms_receipt_key="sim-" + "5" * 32)
    providers = sims.build_providers()
    try:
        assert sims.hms.receipts_url == url + "/v1/receipts/hms"
        r = await providers["hms"].send(make_delivery("push", "hms:tok-sim-" + "c" * 20))
        await _wait(lambda: len(receipts(redis_url)) >= 1)
        assert [(k, v["provider"], v["status"]) for k, v in receipts(redis_url)] == [
            (r.provider_msg_id, "hms", "DELIVERED")]
        assert sims.as_dict()["hms"]["receipt_username"] == "notify-sim"
    finally:
        for p in providers.values():
            await p.close()
        await sims.stop()
        await server.close()


async def test_a_receipt_makes_the_push_record_delivered(redis_url, tmp_path, monkeypatch):
    """End to end: a worker routes push to the Push Kit provider (the simulator), the
    simulator posts its receipts to the API, the worker's receipts agent matches them
    to each device's delivery: the record of a user whose push arrived is DELIVERED,
    that of a user whose app is gone UNDELIVERED with Push Kit's reason."""
    sim = HmsSim(SimProfile.clean(receipt_delay=(0.0, 0.05)), receipt_key="cb-" + "3" * 32)
    await sim.start()
    monkeypatch.setenv(KEY_ENV, sim.receipt_key)
    config = ("receipt_poll_s = 0\n" + hms_toml(sim)
              + '[routes]\npush = ["huawei"]\nsms = []\nemail = []\nwebhook = []\n')
    pipe = Pipeline(redis_url, tmp_path, config=config, **{SECRET_ENV: sim.client_secret})
    settings = dataclasses.replace(load_settings(str(tmp_path / "notify.toml"), env={}), partitions=PARTITIONS,
                                   data_dir=str(tmp_path / "data"), db_path=str(pipe.db))
    (tmp_path / "api").mkdir()
    server, url = await serve_api(settings, redis_url, tmp_path / "api")
    sim.receipts_url = url + "/v1/receipts/huawei"

    async def wait(cond, timeout, what):  # the API and the simulator serve on this loop meanwhile
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {pipe.rows()}"
            await asyncio.sleep(0.2)

    tokens = {"hr1": "IQAAAACy0kYk" + "r" * 40, "hr2": "IQAAAACy0kYk" + "s" * 40}
    try:
        await asyncio.to_thread(pipe.devices, [{"user_id": u, "platform": "hms", "token": t, "op": "add",
                                                "at": 1000.0} for u, t in tokens.items()])
        proc = pipe.start()
        await wait(lambda: "Worker ready" in pipe.log() or proc.poll() is not None, 90, "the worker ready")
        gone = push_event("hr:2", "hr2")
        gone["params"]["carrier"] = "UPS #sim=undelivered"  # the simulator's scenario: status 2
        await asyncio.to_thread(pipe.events, [push_event("hr:1", "hr1"), gone])
        keys = {u: (f"hr:{u[-1]}", u, "push") for u in tokens}
        await wait(lambda: {pipe.rows().get(k, {}).get("status") for k in keys.values()}
                   == {"DELIVERED", "UNDELIVERED"}, 90, "the receipts applied")
        rows = pipe.rows()
        assert (rows[keys["hr1"]]["status"], rows[keys["hr1"]]["provider"]) == ("DELIVERED", "huawei")
        assert (rows[keys["hr2"]]["status"], rows[keys["hr2"]]["reason"]) == ("UNDELIVERED",
                                                                              "hms 2: app not installed")
        assert rows[keys["hr1"]]["delivered_at"] >= rows[keys["hr1"]]["sent_at"]
        # each device's delivery took its own receipt: by the request id its send answered
        devs = pipe.device_rows()
        for u, t in tokens.items():
            did = device_delivery_id(delivery_id(f"hr:{u[-1]}", u, "push"), "hms", t)
            assert devs[did]["status"] == rows[keys[u]]["status"]
            assert devs[did]["provider_msg_id"] == sim.core.by_key[did]
        assert [r["status"] for r in sim.core.receipts] == [200, 200]
        assert "unmatched_receipt" not in pipe.log() and "provider_mismatch" not in pipe.log()
    finally:
        await asyncio.to_thread(pipe.stop)
        await server.close()
        await sim.stop()
