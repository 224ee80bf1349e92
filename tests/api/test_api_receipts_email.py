"""POST /v1/receipts/<name> for e-mail providers of the config (issue 27): a provider
of kind sendgrid takes its Signed Event Webhook, one of kind ses the SNS messages of
its topics, verified with that provider's own settings (its verification key, its
topics); the receipts carry the provider's name; forged ones are 401 and counted."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestServer

from adapters.receipts_email import DEFAULT_CERTS
from adapters.simulators import SimProfile
from adapters.simulators.cloud import start_cloud
from config.settings import load_settings
from pipeline.api import make_app
from tests.adapters.conftest import make_delivery  # noqa: F401 (the fixture)
from tests.api.conftest import BOOTSTRAP, PARTITIONS, make_keys
from tests.api.test_api_receipts import receipts, rejected


@pytest.fixture
async def world(redis_url, tmp_path):
    sims = await start_cloud(profile=SimProfile.clean(receipt_delay=(0.0, 0.05)))
    info = sims.as_dict()
    (tmp_path / "notify.toml").write_text(f"""
[providers.mail_a]
kind = "sendgrid"
base_url = "{info['sendgrid']['base_url']}"
api_key_env = "X"
from_addr = "notify@example.com"
event_webhook_public_key = "{info['sendgrid']['event_webhook_public_key']}"

[providers.ses]
kind = "ses"
base_url = "{info['ses']['base_url']}"
region = "{info['ses']['region']}"
access_key_id = "{info['ses']['access_key_id']}"
secret_access_key_env = "Y"
from_addr = "notify@example.com"
sns_topic_arns = ["{info['ses']['sns_topic_arn']}"]
sns_cert_urls = ["{info['ses']['base_url']}/"]
""")
    settings = dataclasses.replace(load_settings(str(tmp_path / "notify.toml"), env={}), partitions=PARTITIONS,
                                   data_dir=str(tmp_path / "data"), db_path=str(tmp_path / "records.db"))
    keys_path = tmp_path / "api_keys.json"
    make_keys(keys_path)
    app = make_app(settings, broker_url=redis_url, store_path=settings.db_path, keys_path=str(keys_path),
                   bootstrap_key=BOOTSTRAP)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    url = str(server.make_url("")).rstrip("/")
    sims.sendgrid.receipts_url = url + "/v1/receipts/mail_a"
    sims.ses.receipts_url = url + "/v1/receipts/ses"
    providers = sims.build_providers()
    async with aiohttp.ClientSession() as http:
        yield sims, providers, url, http
    for p in providers.values():
        await p.close()
    await server.close()
    await sims.stop()


async def _wait(pred, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_sendgrid_events_under_the_providers_name(world, redis_url, make_delivery):
    sims, providers, url, http = world
    ok = await providers["sendgrid"].send(make_delivery("email", "ann@example.com", {"subject": "s", "text": "t"}))
    bounced = await providers["sendgrid"].send(make_delivery("email", "bounce@example.com",
                                                             {"subject": "s", "text": "t"}))
    await _wait(lambda: len(receipts(redis_url)) >= 3)  # delivered + open, bounce
    got = sorted((k, r["provider"], r["status"]) for k, r in receipts(redis_url))
    assert got == sorted([(ok.provider_msg_id, "mail_a", "DELIVERED"), (ok.provider_msg_id, "mail_a", "DELIVERED"),
                          (bounced.provider_msg_id, "mail_a", "UNDELIVERED")])
    assert {r["status"] for r in sims.sendgrid.core.receipts} == {200}
    # forged: another body under the simulator's signature
    body = sims.sendgrid.event_body(ok.provider_msg_id, ["bounce"])
    headers = sims.sendgrid.signed(body)
    before = rejected("mail_a", "bad_signature")
    async with http.post(url + "/v1/receipts/mail_a", data=body.replace(b"bounce", b"dropped"),
                         headers=headers) as resp:
        assert resp.status == 401 and (await resp.json())["error"]["code"] == "bad_signature"
    assert rejected("mail_a", "bad_signature") == before + 1
    async with http.post(url + "/v1/receipts/mail_a", data=body, headers=headers) as resp:
        assert resp.status == 200 and await resp.json() == {"received": 1}
    # a name that is no sendgrid / ses provider of the config
    async with http.post(url + "/v1/receipts/sendgrid", data=body, headers=headers) as resp:
        assert resp.status == 404


async def test_ses_notifications_through_sns(world, redis_url, make_delivery):
    sims, providers, url, http = world
    await sims.ses.subscribe()  # SNS's SubscriptionConfirmation: the API confirms it
    assert sims.ses.confirmed
    r = await providers["ses"].send(make_delivery("email", "bounce@example.com", {"subject": "s", "text": "t"}))
    await _wait(lambda: len(receipts(redis_url)) >= 1)
    [(key, receipt)] = receipts(redis_url)
    assert (key, receipt["provider"], receipt["status"]) == (r.provider_msg_id, "ses", "UNDELIVERED")
    assert receipt["error"].startswith("bounce Permanent/General")
    note = sims.ses.notification(r.provider_msg_id, "delivery")
    before = rejected("ses", "bad_signature")
    forged = {**note, "Message": note["Message"].replace("Delivery", "Bounce")}
    async with http.post(url + "/v1/receipts/ses", data=orjson.dumps(forged),
                         headers={"Content-Type": "text/plain; charset=UTF-8"}) as resp:
        assert resp.status == 401
    assert rejected("ses", "bad_signature") == before + 1
    async with http.post(url + "/v1/receipts/ses", data=orjson.dumps(note),
                         headers={"Content-Type": "text/plain; charset=UTF-8"}) as resp:
        assert resp.status == 200 and await resp.json() == {"received": 1}
    async with http.post(url + "/v1/receipts/ses", data=orjson.dumps(note),  # SNS's retry: taken once
                         headers={"Content-Type": "text/plain; charset=UTF-8"}) as resp:
        assert resp.status == 200 and await resp.json() == {"received": 0}
    assert sims.ses.signer.cert_path.rsplit("/", 1)[1] in "".join(DEFAULT_CERTS._keys)
