"""Gray release end to end (issue 20, item 5): a template's v2 and a new channel
released through the API to internal users, then to everyone; a real worker
picks the releases up and each record keeps the template version it used."""

import shutil
import time
from pathlib import Path

import orjson

from tests.api.conftest import api, api_app_factory  # noqa: F401
from tests.pipeline.harness import Pipeline
from tests.transport.helpers import wait_until

ROOT = Path(__file__).resolve().parents[2]
SHIP = {"category": "transaction", "template": "order_shipped",
        "params": {"order_no": "7", "carrier": "UPS", "tracking_no": "1Z", "tracking_url": "https://t.example/x"}}


def templates_with_v2(tmp: Path) -> Path:
    root = tmp / "templates"
    shutil.copytree(ROOT / "config" / "templates", root)
    shutil.copytree(root / "order_shipped" / "v1", root / "order_shipped" / "v2")
    (root / "order_shipped" / "v2" / "inbox.en.j2").write_text(
        "{% block title %}v2: order {{ order_no }} is on its way{% endblock %}\n"
        "{% block body %}Track it: {{ tracking_url }}{% endblock %}\n")
    return root


async def test_releases_through_the_api(api):
    status, body = await api.call("PUT", "/v1/releases/hooks", "all",
                                  json={"stage": "internal", "channel": "webhook", "internal_users": ["boss"]})
    assert status == 200 and body["source"] == "api", body
    status, body = await api.call("PUT", "/v1/releases/v9", "all",
                                  json={"stage": "all", "template": "order_shipped", "version": 9})
    assert status == 400 and body["error"]["code"] == "unknown_template"
    status, body = await api.call("PUT", "/v1/releases/bad", "all", json={"stage": "soon", "channel": "sms"})
    assert status == 400 and body["error"]["field"] == "stage"
    status, body = await api.call("PUT", "/v1/releases/hooks", "reader", json={"stage": "all", "channel": "sms"})
    assert status == 403
    status, body = await api.call("GET", "/v1/releases", "all")
    assert status == 200 and [r["name"] for r in body["items"]] == ["hooks"]
    status, _ = await api.call("DELETE", "/v1/releases/hooks", "all")
    assert status == 200
    status, _ = await api.call("DELETE", "/v1/releases/hooks", "all")
    assert status == 404


def test_a_template_version_and_a_channel_go_to_internal_users_first(redis_url, tmp_path, redis_sync):
    tdir = templates_with_v2(tmp_path)
    pipe = Pipeline(redis_url, tmp_path, config=f'receipt_poll_s = 0\ntemplates_dir = "{tdir}"\n',
                    NOTIFY_WEBHOOK_ALLOW="127.0.0.1:9")
    try:
        pipe.preferences([{"user_id": u, "version": 1, "webhook_url": "https://hooks.example/x"}
                          for u in ("boss", "gr1")])
        # as PUT /v1/releases/<name> stores them
        redis_sync.hset("nfs:releases", "ship-v2", orjson.dumps(
            {"stage": "internal", "template": "order_shipped", "version": 2, "internal_users": ["boss"]}))
        redis_sync.hset("nfs:releases", "hooks", orjson.dumps(
            {"stage": "internal", "channel": "webhook", "internal_users": ["boss"]}))
        proc = pipe.start()
        wait_until(lambda: "Worker ready" in pipe.log() or proc.poll() is not None, 60, 0.1, "the worker ready")
        time.sleep(2.5)  # the releases are read every 2 s
        pipe.events([{**SHIP, "biz_key": "gr:1", "recipients": ["boss", "gr1"], "channels": ["inbox", "webhook"]}])
        rows = pipe.wait_rows(lambda r: len(r) == 4 and r[("gr:1", "gr1", "inbox")]["status"] == "DELIVERED"
                              and r[("gr:1", "boss", "inbox")]["status"] == "DELIVERED", 60, "four records")
        assert rows[("gr:1", "boss", "inbox")]["template_version"] == 2
        assert rows[("gr:1", "gr1", "inbox")]["template_version"] == 1
        assert (rows[("gr:1", "gr1", "webhook")]["status"], rows[("gr:1", "gr1", "webhook")]["reason"]) == \
            ("FILTERED", "not_released")
        assert rows[("gr:1", "boss", "webhook")]["status"] != "FILTERED"
        # released to everyone: the next event renders v2 for every user
        redis_sync.hset("nfs:releases", "ship-v2", orjson.dumps(
            {"stage": "all", "template": "order_shipped", "version": 2}))
        time.sleep(2.5)  # the next read of the releases
        pipe.events([{**SHIP, "biz_key": "gr:2", "recipients": ["gr1"], "channels": ["inbox"]}])
        rows = pipe.wait_rows(lambda r: ("gr:2", "gr1", "inbox") in r
                              and r[("gr:2", "gr1", "inbox")]["status"] == "DELIVERED", 60, "v2 for everyone")
        assert rows[("gr:2", "gr1", "inbox")]["template_version"] == 2
    finally:
        pipe.stop()


async def test_the_releases_stand_while_the_broker_is_away():
    """``releases.refresh`` is a timer of every worker: a read that fails (a master
    failing over, past the client's retries) keeps the last releases; raised, it
    crashed the worker (the cluster failover drill saw it)."""
    from types import SimpleNamespace

    from agents.releases import Releases
    from config.settings import load_settings
    import redis.asyncio as aioredis

    settings = load_settings()
    dead = aioredis.Redis.from_url("redis://127.0.0.1:1", socket_connect_timeout=0.5)

    async def side_client():
        return dead

    app = SimpleNamespace(settings=settings, resources=SimpleNamespace(side_client=side_client),
                          transport=SimpleNamespace(keys=SimpleNamespace(releases="nfs:releases")))
    r = Releases(app)
    before = r.releases()
    try:
        await r.refresh()  # refused: no exception
    finally:
        await dead.aclose()
    assert r.releases() == before
