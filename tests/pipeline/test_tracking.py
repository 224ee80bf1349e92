"""Tracking end to end (issue 20 item 4): the pipeline in process rewrites the
inbox message's link to the API's signed redirect; the API (a real socket,
real Redis, the same SQLite file) records the click and forwards, records
inbox reads and reported reads, and shows the rates on /v1/stats, the status
page's data and `notify stats`. Opt-outs, whatever sends them (the API's PUT, a
producer writing notify.preferences, the one-click unsubscribe link of a
marketing e-mail, a SendGrid spam report), are recorded once by the users agent
where the pipeline applies them; the e-mail goes through SendGrid's simulator,
which shows what a mail client gets (List-Unsubscribe)."""

import asyncio
import json
import os
import re
import subprocess
import sys
import time

from types import SimpleNamespace

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from adapters.simulators import SimProfile
from adapters.simulators.cloud import start_cloud
from config.settings import load_settings
from pipeline.api import make_app
from pipeline.keyfile import tracking_key
from pipeline.models import Preferences
from pipeline.rules.tracking import sign_unsubscribe
from pipeline.store import RecordStore
from pipeline.testing import running, send_event, wait_records
from tests.transport.helpers import ROOT

KEY = "k-tracking"
TARGET = "https://t.example/x?a=1&b=2"


def _event(biz, user):
    return {"biz_key": biz, "category": "transaction", "template": "order_shipped", "recipients": [user],
            "channels": ["inbox"], "params": {"order_no": "1", "carrier": "UPS", "tracking_no": "1Z",
                                              "tracking_url": TARGET}}


async def until(pred, what, timeout=15.0):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def _version(app, uid):
    """The version of a user's preferences in this worker's table (None: none yet)."""
    prefs = app.user_tables.preferences.get(uid)
    return None if prefs is None else prefs.version


async def unsubscribes(http, base, auth, uid, n=1, timeout=15.0):
    """GET /v1/unsubscribes?user_id=…, once it lists ``n`` (the users agent records them)."""
    deadline = time.monotonic() + timeout
    while True:
        async with http.get(f"{base}/v1/unsubscribes?user_id={uid}", headers=auth) as resp:
            assert resp.status == 200
            items = (await resp.json())["items"]
        if len(items) >= n or time.monotonic() > deadline:
            return items
        await asyncio.sleep(0.05)


@pytest.fixture
def env(redis_url, tmp_path):
    return {"REDIS_URL": redis_url, "NOTIFY_DATA_DIR": str(tmp_path / "data"), "NOTIFY_PROVIDERS": "fake",
            "NOTIFY_PARTITIONS": "2"}


async def test_click_read_unsubscribe_and_rates_end_to_end(env, redis_url, tmp_path):
    settings = load_settings(env=env)
    async with running(settings) as app:
        await send_event(app, _event("trk1", "u1"))
        await send_event(app, _event("trk2", "u2"))
        r1 = await wait_records(app, "trk1")
        r2 = await wait_records(app, "trk2")
        assert r1[0]["status"] == "DELIVERED" and r2[0]["status"] == "DELIVERED"
        store = await app.resources.store()
        items, _ = await store.inbox("u1")
        body = items[0]["body"]
        assert TARGET not in body  # rewritten at render time
        link = re.search(r"http://127\.0\.0\.1:8080(/t/c/[A-Za-z0-9_-]+)", body).group(1)
        did1, did2 = r1[0]["delivery_id"], r2[0]["delivery_id"]
        # the key was generated once, 0600, and is shared by the API of this data dir
        assert oct(os.stat(tmp_path / "data" / "tracking.key").st_mode & 0o777) == "0o600"

        server = TestServer(make_app(settings, broker_url=redis_url, store_path=settings.db_path,
                                     bootstrap_key=KEY), host="127.0.0.1")
        await server.start_server()
        base = str(server.make_url("")).rstrip("/")
        auth = {"Authorization": f"Bearer {KEY}"}
        try:
            async with aiohttp.ClientSession() as http:
                # a click: recorded, then forwarded; no key needed (the token is the authority)
                async with http.get(base + link, allow_redirects=False, headers={"User-Agent": "ua/1"}) as resp:
                    assert resp.status == 302 and resp.headers["Location"] == TARGET
                bad = link[:-3] + ("AAA" if not link.endswith("AAA") else "BBB")
                async with http.get(base + bad, allow_redirects=False) as resp:
                    assert resp.status == 404 and bad.rsplit("/", 1)[1] not in await resp.text()
                # the pixel is off by default
                async with http.get(base + "/t/o/AAAA.gif") as resp:
                    assert resp.status == 404
                # an inbox read through the existing mark-read; a reported read of another delivery
                async with http.post(base + "/v1/users/u1/inbox/read", json={"delivery_ids": [did1]},
                                     headers=auth) as resp:
                    assert resp.status == 200 and (await resp.json())["marked"] == 1
                async with http.post(base + "/v1/reads", headers=auth, json={"reads": [
                        {"delivery_id": did2, "kind": "inbox"},
                        {"delivery_id": "n_00000000000000000000.push"}]}) as resp:
                    assert resp.status == 200 and await resp.json() == {"received": 2, "recorded": 1}
                async with http.post(base + "/v1/reads", headers=auth, json={"reads": [
                        {"delivery_id": did2, "kind": "nope"}]}) as resp:
                    assert resp.status == 400
                # an opt-out: a preferences update turning a switch off, recorded where the
                # pipeline applies it (agents/users.py), so the API's list shows it shortly after
                async with http.put(base + "/v1/users/u1/preferences", headers=auth,
                                    json={"switches": {"marketing.email": False, "transaction.inbox": True}}) as resp:
                    assert resp.status == 202
                async with http.put(base + "/v1/users/u1/preferences", headers=auth,
                                    json={"switches": {"marketing.email": False}}) as resp:
                    assert resp.status == 202  # already off: no second record
                await until(lambda: _version(app, "u1") == 2, "the second update applied")
                items = await unsubscribes(http, base, auth, "u1")
                assert [(i["category"], i["channel"], i["source"]) for i in items] == [("marketing", "email", "api")]
                # the rates
                async with http.get(base + "/v1/stats", headers=auth) as resp:
                    rows = (await resp.json())["rows"]
                assert rows == [{"template": "order_shipped", "channel": "inbox", "records": 2, "sent": 2,
                                 "delivered": 2, "clicked": 1, "read": 2, "delivery_rate": 1.0, "click_rate": 0.5,
                                 "read_rate": 1.0}]
                async with http.get(base + "/v1/stats") as resp:
                    assert resp.status == 401
                async with http.get(base + "/v1/status.json") as resp:
                    assert (await resp.json())["engagement"] == rows
        finally:
            await server.close()

    store = await RecordStore(settings.db_path).open()
    try:
        clicks = await store._read("SELECT delivery_id, link, url, ua_hash FROM clicks")
        assert [tuple(c)[:3] for c in clicks] == [(did1, 0, TARGET)] and clicks[0]["ua_hash"]
    finally:
        await store.close()

    out = subprocess.run([sys.executable, "-m", "pipeline.cli", "stats"], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, **env}, timeout=60)
    assert out.returncode == 0, out.stderr
    assert re.search(r"order_shipped\s+inbox\s+2\s+2\s+1\s+2\s+100\.0%\s+50\.0%\s+100\.0%", out.stdout), out.stdout
    out = subprocess.run([sys.executable, "-m", "pipeline.cli", "stats", "--json", "--since", "2000-01-01"], cwd=ROOT,
                         capture_output=True, text=True, env={**os.environ, **env}, timeout=60)
    assert json.loads(out.stdout)["rows"] == rows


# ---------------------------------------------------------------- opt-outs, recorded where they are applied

PROMO = {"category": "marketing", "template": "promo", "channels": ["email"],
         "params": {"headline": "Sale", "discount": "10%", "url": "https://shop.example/sale"}}
#: the links' base URL (the default [tracking] base_url): the test's API is elsewhere
PUBLIC = "http://127.0.0.1:8080"


@pytest.fixture
async def mail(redis_url, tmp_path):
    """The pipeline in process with e-mail routed to SendGrid's simulator (as
    api.sendgrid.com would be), and the API on a real socket, taking SendGrid's
    signed Event Webhook at POST /v1/receipts/sendgrid."""
    sims = await start_cloud(profile=SimProfile.clean(receipt_delay=(0.0, 0.05)))
    sg = sims.sendgrid
    (tmp_path / "sendgrid_key").write_text(sg.api_key + "\n")
    (tmp_path / "notify.toml").write_text(f"""receipt_poll_s = 0

[providers.sendgrid]
kind = "sendgrid"
base_url = "{sg.base_url}"
api_key_file = "sendgrid_key"
from_addr = "notify@example.com"
event_webhook_public_key = "{sg.public_key}"
timeout = 5

[routes]
email = ["sendgrid"]
push = []
sms = []
webhook = []
""")
    settings = load_settings(str(tmp_path / "notify.toml"), env={
        "REDIS_URL": redis_url, "NOTIFY_DATA_DIR": str(tmp_path / "data"), "NOTIFY_PARTITIONS": "2"})
    try:
        async with running(settings) as app:
            server = TestServer(make_app(settings, broker_url=redis_url, store_path=settings.db_path,
                                         bootstrap_key=KEY), host="127.0.0.1")
            await server.start_server()
            base = str(server.make_url("")).rstrip("/")
            sg.receipts_url = base + "/v1/receipts/sendgrid"
            try:
                async with aiohttp.ClientSession() as http:
                    yield SimpleNamespace(app=app, sg=sg, base=base, http=http, settings=settings,
                                          auth={"Authorization": f"Bearer {KEY}"})
            finally:
                await server.close()
    finally:
        await sims.stop()


async def _subscribed(m, uid):
    """The user's address set through the API, applied by the pipeline."""
    async with m.http.put(f"{m.base}/v1/users/{uid}/preferences", headers=m.auth,
                          json={"email": f"{uid}@example.com"}) as resp:
        assert resp.status == 202
    await until(lambda: _version(m.app, uid) == 1, f"{uid}'s preferences applied")


def _sent_to(sg, address):
    return [msg for msg in sg.core.messages.values() if msg["to"] == address]


async def test_one_click_unsubscribe_end_to_end(mail):
    m = mail
    await _subscribed(m, "m1")
    await send_event(m.app, {**PROMO, "biz_key": "promo1", "recipients": ["m1"]})
    [rec] = await wait_records(m.app, "promo1")
    assert rec["status"] in ("ACCEPTED", "DELIVERED") and rec["provider"] == "sendgrid", rec
    # what the mail client gets: RFC 8058's headers, and the same link in the footer
    [msg] = _sent_to(m.sg, "m1@example.com")
    headers = msg["body"]["headers"]
    assert headers["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    url = re.fullmatch(r"<(http://127\.0\.0\.1:8080/u/[A-Za-z0-9_-]+)>", headers["List-Unsubscribe"]).group(1)
    text = msg["body"]["content"][0]["value"]
    assert f"Unsubscribe: {url}" in text and "https://shop.example/sale" not in text  # that one is tracked
    path = url[len(PUBLIC):]

    # the page a browser opens: what it turns off, and the form
    async with m.http.get(m.base + path) as resp:
        page = await resp.text()
        assert resp.status == 200 and resp.headers["Cache-Control"] == "no-store"
        assert "marketing" in page and 'name="List-Unsubscribe" value="One-Click"' in page
    # a token this deployment did not sign: 404, nothing echoed; a POST without the body: 400
    bad = path[:-3] + ("AAA" if not path.endswith("AAA") else "BBB")
    async with m.http.post(m.base + bad, data={"List-Unsubscribe": "One-Click"}) as resp:
        assert resp.status == 404 and bad.rsplit("/", 1)[1] not in await resp.text()
    async with m.http.post(m.base + path) as resp:
        assert resp.status == 400
    # the mail client's POST: no key, no cookie
    async with m.http.post(m.base + path, data={"List-Unsubscribe": "One-Click"}) as resp:
        assert resp.status == 200 and "no longer receive" in await resp.text()
    items = await unsubscribes(m.http, m.base, m.auth, "m1")
    assert [(i["category"], i["channel"], i["source"], i["producer"]) for i in items] == [
        ("marketing", "email", "one_click", "")]
    # the switch is off in the pipeline's table (the address kept) and in the API's read model
    prefs = m.app.user_tables.preferences.get("m1")
    assert prefs.switches == {"marketing.email": False} and prefs.email == "m1@example.com"
    async with m.http.get(m.base + "/v1/users/m1/preferences", headers=m.auth) as resp:
        doc = await resp.json()
        assert doc["switches"] == {"marketing.email": False} and doc["version"] == 2 and "source" not in doc
    # the next marketing e-mail to that user is filtered
    await send_event(m.app, {**PROMO, "biz_key": "promo2", "recipients": ["m1"]})
    recs = {r["channel"]: r for r in await wait_records(m.app, "promo2", n=2)}
    assert (recs["email"]["status"], recs["email"]["reason"]) == ("FILTERED", "opted_out")
    assert "inbox" in recs  # marketing's inbox fallback (the user chose no other channel)
    assert len(_sent_to(m.sg, "m1@example.com")) == 1

    # a link to what cannot be refused (signed with this deployment's key, as no delivery's is):
    # a page saying so, nothing changed
    otp = "/u/" + sign_unsubscribe(tracking_key(m.settings), "m1", "otp", "email")
    for method in ("GET", "POST"):
        async with m.http.request(method, m.base + otp, data={"List-Unsubscribe": "One-Click"}) as resp:
            assert resp.status == 403 and "cannot be unsubscribed" in await resp.text()
            assert resp.content_type == "text/html"

    # clicked again (multipart, as some clients send it): answered, recorded once. An update
    # written after it to the same user's partition tells when it was applied.
    form = aiohttp.FormData({"List-Unsubscribe": "One-Click"}, default_to_multipart=True)
    async with m.http.post(m.base + path, data=form) as resp:
        assert resp.status == 200
    await m.app.declared.preferences.send(key="m1", value=Preferences(
        user_id="m1", switches={"social.email": False}, merge=True))
    items = await unsubscribes(m.http, m.base, m.auth, "m1", n=2)
    assert sorted((i["category"], i["channel"], i["source"]) for i in items) == [
        ("marketing", "email", "one_click"), ("social", "email", "stream")]
    await asyncio.sleep(0.3)
    assert len(await unsubscribes(m.http, m.base, m.auth, "m1", n=3, timeout=0)) == 2


async def test_a_sendgrid_spam_report_turns_email_off_and_is_recorded(mail):
    m = mail
    await _subscribed(m, "m2")
    await send_event(m.app, {**PROMO, "biz_key": "promo3", "recipients": ["m2"]})
    [rec] = await wait_records(m.app, "promo3")
    assert rec["provider"] == "sendgrid", rec
    [msg] = _sent_to(m.sg, "m2@example.com")
    # the recipient marks it as spam: SendGrid's signed event, as its Event Webhook posts it
    body = m.sg.event_body(msg["message_id"], ["spamreport"])
    async with m.http.post(m.base + "/v1/receipts/sendgrid", data=body, headers=m.sg.signed(body)) as resp:
        assert resp.status == 200 and await resp.json() == {"received": 1}
    items = await unsubscribes(m.http, m.base, m.auth, "m2")
    assert [(i["category"], i["channel"], i["source"]) for i in items] == [("marketing", "email", "provider:sendgrid")]
    assert m.app.user_tables.preferences.get("m2").switches == {"marketing.email": False}
    [rec] = await wait_records(m.app, "promo3", states=("DELIVERED",))
    assert rec["status"] == "DELIVERED"  # the receipt itself, as before
    await send_event(m.app, {**PROMO, "biz_key": "promo4", "recipients": ["m2"]})
    recs = {r["channel"]: r for r in await wait_records(m.app, "promo4", n=2)}
    assert (recs["email"]["status"], recs["email"]["reason"]) == ("FILTERED", "opted_out")


async def test_an_update_written_to_the_topic_is_recorded_once_however_often_it_is_applied(env):
    settings = load_settings(env=env)
    async with running(settings) as app:
        topic = app.declared.preferences.get_topic_name()
        store = await app.resources.store()

        async def put(prefs, at):
            """An entry of notify.preferences as a producer writes it (at: its broker time)."""
            await (await app.producer.send(topic, prefs.user_id.encode(), prefs.dumps(), None, at, None))

        async def rows(uid, n):
            deadline = time.monotonic() + 15
            while True:
                got = await store.unsubscribes(user_id=uid)
                if len(got) >= n or time.monotonic() > deadline:
                    return sorted((r["category"], r["channel"], r["source"], r["at"]) for r in got)
                await asyncio.sleep(0.05)

        off = Preferences(user_id="s1", version=1, email="s1@example.com", switches={"marketing.email": False})
        t1 = time.time()
        await put(off, t1)
        assert await rows("s1", 1) == [("marketing", "email", "stream", t1)]
        # the same entry again (a replay: the table has it, nothing is turned off)
        await put(off, t1)
        # a crash after the row was written, before the table change was: the row is
        # there, the table does not have it; the entry read again adds no second row
        t2 = time.time()
        await store.add_unsubscribes([("s2", "marketing", "sms", "stream", t2, "")])
        await put(Preferences(user_id="s2", version=1, switches={"marketing.sms": False}), t2)
        # later updates of the same users (their partitions' order): applied after those
        t3 = time.time()
        await put(Preferences(user_id="s1", version=2, switches={"marketing.email": False, "social.push": False}), t3)
        await put(Preferences(user_id="s2", version=2, switches={"marketing.sms": False, "social.push": False}), t3)
        assert await rows("s1", 2) == [("marketing", "email", "stream", t1), ("social", "push", "stream", t3)]
        assert await rows("s2", 2) == [("marketing", "sms", "stream", t2), ("social", "push", "stream", t3)]
        assert app.user_tables.preferences.get("s2").switches == {"marketing.sms": False, "social.push": False}
        assert len(await store.unsubscribes(user_id="s1")) == 2 and len(await store.unsubscribes(user_id="s2")) == 2
