"""`notify dlq replay --source lane` replays (issue 24, item 3): a delivery that failed
for good (its receiver refused it) is dead-lettered; once the receiver is fixed, the
replay makes one new provider call and the record moves to ACCEPTED; replaying it
again is refused with the reason. Against a real worker and a real HTTP receiver."""

from __future__ import annotations

import json
import os

from aiohttp import web

from tests.cli.test_cli import ROOT, notify
from tests.pipeline.harness import Pipeline
from tests.pipeline.http_thread import serve
from tests.transport.helpers import wait_until


class Receiver:
    """A webhook receiver that refuses (400) until ``fixed``."""

    def __init__(self) -> None:
        self.fixed = False
        self.calls = 0
        self.port = serve(web.post("/hook", self.hook))

    async def hook(self, request: web.Request) -> web.Response:
        await request.read()
        self.calls += 1
        return web.json_response({"ok": True}) if self.fixed else web.json_response({"error": "no"}, status=400)


def test_a_dead_lettered_delivery_is_replayed_once_and_its_record_moves(redis_url, tmp_path):
    rx = Receiver()
    # a receiver on this machine: allowed explicitly (only the simulators' own is by default)
    pipe = Pipeline(redis_url, tmp_path, NOTIFY_PROVIDERS="simulators", NOTIFY_WEBHOOK_ALLOW=f"127.0.0.1:{rx.port}")
    try:
        pipe.preferences([{"user_id": "rp1", "version": 1, "webhook_url": f"http://127.0.0.1:{rx.port}/hook"}])
        proc = pipe.start()
        wait_until(lambda: "Worker ready" in pipe.log() or proc.poll() is not None, 60, 0.1, "the worker ready")
        pipe.events([{"biz_key": "rp:1", "category": "transaction", "template": "order_shipped", "recipients": ["rp1"],
                      "channels": ["webhook"], "params": {"order_no": "1", "carrier": "UPS", "tracking_no": "1Z",
                                                          "tracking_url": "https://t.example/x"}}])
        key = ("rp:1", "rp1", "webhook")
        pipe.wait_rows(lambda r: r.get(key, {}).get("status") == "FAILED", 60, "the delivery failed for good")
        assert rx.calls == 1
        env = dict(os.environ, NOTIFY_BROKER=redis_url, NOTIFY_PARTITIONS=str(pipe.partitions), PYTHONPATH=str(ROOT),
                   **{k: v for k, v in pipe.env.items() if k in ("NOTIFY_DB", "NOTIFY_CONFIG", "NOTIFY_DATA_DIR")})
        wait_until(lambda: "rejected" in notify(env, "dlq", "ls").stdout, 30, 0.2, "the dead letter")

        rx.fixed = True
        out = json.loads(notify(env, "dlq", "replay", "--source", "lane").stdout)
        assert out["replayed"] == {"notify.send.webhook.normal": 1} and out["not_replayed"] == {}
        rows = pipe.wait_rows(lambda r: r.get(key, {}).get("status") == "ACCEPTED", 60, "the replay accepted")
        assert rx.calls == 2  # exactly one new provider call
        assert pipe.attempts()[rows[key]["delivery_id"]] == 2
        again = json.loads(notify(env, "dlq", "replay", "--source", "lane").stdout)
        assert again["replayed"] == {} and list(again["not_replayed"].values()) == [1]
        assert "already ACCEPTED" in next(iter(again["not_replayed"]))
        assert rx.calls == 2
    finally:
        pipe.stop()
