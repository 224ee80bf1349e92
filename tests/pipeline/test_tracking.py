"""Tracking end to end (issue 20 item 4): the pipeline in process rewrites the
inbox message's link to the API's signed redirect; the API (a real socket,
real Redis, the same SQLite file) records the click and forwards, records
inbox reads and reported reads, records opt-outs, and shows the rates on
/v1/stats, the status page's data and `notify stats`."""

import json
import os
import re
import subprocess
import sys

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from config.settings import load_settings
from pipeline.api import make_app
from pipeline.testing import running, send_event, wait_records
from tests.transport.helpers import ROOT

KEY = "k-tracking"
TARGET = "https://t.example/x?a=1&b=2"


def _event(biz, user):
    return {"biz_key": biz, "category": "transaction", "template": "order_shipped", "recipients": [user],
            "channels": ["inbox"], "params": {"order_no": "1", "carrier": "UPS", "tracking_no": "1Z",
                                              "tracking_url": TARGET}}


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

    server = TestServer(make_app(settings, broker_url=redis_url, store_path=settings.db_path, bootstrap_key=KEY),
                        host="127.0.0.1")
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
                    {"delivery_id": did2, "kind": "inbox"}, {"delivery_id": "n_00000000000000000000.push"}]}) as resp:
                assert resp.status == 200 and await resp.json() == {"received": 2, "recorded": 1}
            async with http.post(base + "/v1/reads", headers=auth, json={"reads": [{"delivery_id": did2,
                                                                                     "kind": "nope"}]}) as resp:
                assert resp.status == 400
            # an opt-out: a preferences update turning a switch off
            async with http.put(base + "/v1/users/u1/preferences", headers=auth,
                                json={"switches": {"marketing.email": False, "transaction.inbox": True}}) as resp:
                assert resp.status == 202
            async with http.put(base + "/v1/users/u1/preferences", headers=auth,
                                json={"switches": {"marketing.email": False}}) as resp:
                assert resp.status == 202  # already off: no second record
            async with http.get(base + "/v1/unsubscribes?user_id=u1", headers=auth) as resp:
                items = (await resp.json())["items"]
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

    from pipeline.store import RecordStore

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
