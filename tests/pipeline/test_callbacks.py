"""Producers hear back (issue 27, item 1): every state change of an event that names
a callback URL (or whose producer's key has one) reaches the producer, signed the
Standard Webhooks way (judged by the ``standardwebhooks`` library a producer
verifies with), each state-change id at least once (de-duplicated by the id),
also when the endpoint was down for "10 minutes" (the backoff compressed by the
[callbacks] knobs: 1/100 of the defaults) and the worker was killed meanwhile.

The first tests drive the durable callback set (pipeline/callback_queue.py)
against the test's valkey; the last runs a real worker."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import defaultdict

import orjson
import pytest
import redis
import redis.asyncio
from aiohttp import web
from standardwebhooks import Webhook, WebhookVerificationError

from pipeline.api.auth import add_key, key_callback
from pipeline.callback_queue import CallbackQueue, list_callbacks, replay
from pipeline.embedded import free_port
from pipeline.reader import outcome_values
from pipeline.rules import callbacks as R
from tests.transport.helpers import ROOT, wait_until

from .harness import Pipeline
from tests.api.conftest import api, api_app_factory  # noqa: F401,E402  (the API's fixtures)

# ---------------------------------------------------------------- the durable set


def _batch(biz, states, url="https://shop.example/cb", producer="shop"):
    outs = [({"delivery_id": f"n_{biz}.sms", "biz_key": biz, "producer": producer, "state": s, "retry_count": i,
              "at": 100.0 + i}, url) for i, s in enumerate(states)]
    return R.group(outs, 100)


def test_changes_join_their_events_open_callback_until_it_is_claimed(redis_url):
    async def run():
        r = redis.asyncio.Redis.from_url(redis_url)
        q = CallbackQueue(r, "nfs")
        assert await q.enqueue(_batch("b1", ["PENDING"]), 100, now=1000.0) == 1
        assert await q.enqueue(_batch("b1", ["PENDING", "ACCEPTED"]), 100, now=1001.0) == 0  # joined, the repeat kept once
        assert await q.enqueue(_batch("b1", ["DELIVERED"], url="https://other.example/cb"), 100, now=1001.0) == 1
        assert await q.enqueue(_batch("b2", ["PENDING"]), 100, now=1002.0) == 1
        got = await q.claim(10, lease_s=30, now=1005.0)
        assert [(c.biz_key, c.url, sorted(c.changes)) for c in got] == [
            ("b1", "https://shop.example/cb", ["n_b1.sms.ACCEPTED.1", "n_b1.sms.PENDING.0"]),
            ("b1", "https://other.example/cb", ["n_b1.sms.DELIVERED.0"]),
            ("b2", "https://shop.example/cb", ["n_b2.sms.PENDING.0"])]
        assert await q.claim(10, lease_s=30, now=1006.0) == []  # in flight: leased
        # claimed: closed to new changes (the POST's body is fixed), a new one starts
        assert await q.enqueue(_batch("b1", ["FAILED"]), 100, now=1007.0) == 1
        first, b2 = got[0], got[2]
        assert await q.done(got[1])
        assert await q.retry(first, at=2000.0, error="503", now=1008.0)
        assert await q.enqueue(_batch("b1", ["UNDELIVERED"]), 100, now=1009.0) == 0  # joins the open FAILED one
        again = await q.claim(10, lease_s=30, now=1010.0)
        assert [sorted(c.changes) for c in again] == [["n_b1.sms.FAILED.0", "n_b1.sms.UNDELIVERED.0"]]
        assert await q.done(again[0])
        # after a failed try a callback is open again: the event's new changes join it, at its time
        assert await q.retry(b2, at=3000.0, error="connect refused", now=1011.0)
        assert await q.enqueue(_batch("b2", ["PENDING", "ACCEPTED"]), 100, now=1012.0) == 0
        assert await q.claim(10, lease_s=30, now=1999.0) == []
        later = await q.claim(10, lease_s=30, now=2000.0)
        assert [c.id for c in later] == [first.id] and later[0].attempts == 1 and later[0].since == 1008.0
        assert not await q.done(first)  # an old claim's token no longer holds it
        assert await q.done(later[0])
        last = await q.claim(10, lease_s=30, now=3000.0)
        assert [(c.id, sorted(c.changes), c.since) for c in last] == [
            (b2.id, ["n_b2.sms.ACCEPTED.1", "n_b2.sms.PENDING.0"], 1012.0)]  # the horizon starts again
        assert await q.done(last[0])
        assert await q.claim(10, lease_s=30, now=1e10) == [] and await q.next_due() is None
        await r.aclose()

    asyncio.run(run())


def test_a_lease_that_ends_lets_another_worker_post_and_failed_ones_are_listed_and_replayed(redis_url, redis_sync):
    async def run():
        r = redis.asyncio.Redis.from_url(redis_url)
        q = CallbackQueue(r, "nfs")
        await q.enqueue(_batch("b1", ["PENDING", "ACCEPTED"]), 100, now=1000.0)
        await q.enqueue(_batch("b2", ["FAILED"]), 100, now=1000.0)
        a = (await q.claim(1, lease_s=10, now=1000.0))[0]
        assert a.biz_key == "b1"
        b = {c.biz_key: c for c in await q.claim(5, lease_s=10, now=1011.0)}  # a's lease ended: taken again
        assert set(b) == {"b1", "b2"} and b["b1"].id == a.id and b["b1"].token != a.token
        assert not await q.give_up(a, "late")  # only the current claim decides
        assert await q.give_up(b["b1"], "target_refused: 127.0.0.1", now=1012.0)
        await r.aclose()
        return a.id

    eid = asyncio.run(run())
    failed = list_callbacks(redis_sync, "nfs", failed=True)
    assert [(f["id"], f["state"], f["changes"], f["last_error"]) for f in failed] == [
        (eid, "failed", 2, "target_refused: 127.0.0.1")]
    assert failed[0]["url"] == "https://shop.example/…"  # masked: a path may be a secret
    waiting = list_callbacks(redis_sync, "nfs", now=1013.0)
    assert [(w["state"], w["changes"]) for w in waiting] == [("in_flight", 1)]
    assert replay(redis_sync, "nfs", now=1013.0) == (1, 0)
    assert list_callbacks(redis_sync, "nfs", failed=True) == []
    states = {w["id"]: w for w in list_callbacks(redis_sync, "nfs", now=1013.0)}
    assert states[eid]["state"] == "pending" and states[eid]["attempts"] == 0


# ---------------------------------------------------------------- at the door


async def test_the_api_takes_a_callback_url_into_the_stream_and_refuses_a_bad_one(api):
    ev = {"biz_key": "cb:api", "category": "transaction", "template": "order_shipped", "recipients": ["u1"],
          "params": {"order_no": "A1", "carrier": "UPS", "tracking_no": "1Z", "tracking_url": "https://t.example/1"},
          "callback_url": "https://shop.example/notify-status"}
    status, body = await api.call("POST", "/v1/events", "events", json=ev)
    assert status == 202, body
    r = redis.Redis.from_url(api.redis_url)
    try:
        written = [orjson.loads(f[b"v"]) for p in range(4) for _i, f in r.xrange(f"nfs:{{notify.events|{p}}}:s")]
    finally:
        r.close()
    assert [(e["biz_key"], e["callback_url"], e["producer"]) for e in written] == [
        ("cb:api", "https://shop.example/notify-status", "test")]
    for bad in ("http://user:pw@shop.example/", "https://shop.example/\u202e", "gopher://shop.example/", 7):
        status, body = await api.call("POST", "/v1/events", "events", json=dict(ev, biz_key="cb:bad", callback_url=bad))
        assert status == 400 and body["error"]["field"] == "callback_url", body


# ---------------------------------------------------------------- a producer's receiver


class Receiver:
    """A producer's callback endpoint on 127.0.0.1 that can go down and come back
    on the same port. Keeps every request it answered."""

    def __init__(self) -> None:
        self.port = free_port()
        self.requests: list[tuple[dict, bytes, str]] = []
        self.loop = asyncio.new_event_loop()
        self.runner = None
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.requests.append(({k.lower(): v for k, v in request.headers.items()}, body, request.path))
        return web.Response(status=204)

    async def _up(self) -> None:
        app = web.Application()
        app.router.add_post("/{tail:.*}", self._handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port, reuse_address=True).start()

    async def _down(self) -> None:
        await self.runner.cleanup()

    def up(self) -> None:
        asyncio.run_coroutine_threadsafe(self._up(), self.loop).result(10)

    def down(self) -> None:
        asyncio.run_coroutine_threadsafe(self._down(), self.loop).result(10)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}"

    def verified(self, secret: str) -> dict[str, dict]:
        """change id → the change, from every request (all must verify)."""
        out: dict[str, dict] = {}
        for headers, body, _path in list(self.requests):
            doc = Webhook(secret).verify(body, headers)  # raises if any does not verify
            assert headers["webhook-id"] == R.message_id(c["id"] for c in doc["changes"])
            for c in doc["changes"]:
                out.setdefault(c["id"], dict(c, biz_key=doc["biz_key"]))
        return out


def _outcome_ids(url: str, biz_keys: set, partitions: int, topic: str = "notify.outcomes") -> dict[str, set]:
    """biz_key → the change ids its outcomes make, from the outcome stream itself
    (or from ``topic``)."""
    r = redis.Redis.from_url(url)
    out: dict[str, set] = defaultdict(set)
    try:
        for p in range(partitions):
            for o in (orjson.loads(v) for _id, fields in r.xrange(f"nfs:{{{topic}|{p}}}:s")
                      for v in outcome_values(fields[b"v"])):
                if biz_keys is None or o["biz_key"] in biz_keys:
                    out[o["biz_key"]].add(R.change_id(o))
    finally:
        r.close()
    return out


def _cli(url: str, *argv: str) -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "pipeline.cli", *argv], cwd=str(ROOT), capture_output=True, text=True,
                         env=dict(os.environ, NOTIFY_BROKER=url, PYTHONPATH=str(ROOT)), timeout=60)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def _metrics(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
            if line.startswith("notify_callbacks_") and " " in line}


@pytest.fixture
def receiver():
    rc = Receiver()
    rc.up()
    yield rc
    try:
        rc.down()
    except Exception:  # noqa: BLE001 - already down
        pass


SHIPPED = {"order_no": "A1", "carrier": "UPS", "tracking_no": "1Z", "tracking_url": "https://t.example/1Z"}
COMPRESSED = ("receipt_poll_s = 1\n[callbacks]\n"
              "base_delay_s = 0.05\nmax_delay_s = 36\nretry_for_s = 864\ntimeout_s = 1\n")  # the defaults / 100


def test_a_producer_hears_every_state_change_once_per_id_signed_also_after_10_minutes_down(redis_url, tmp_path, receiver):
    keys_path = tmp_path / "data" / "api_keys.json"
    kid, _key = add_key(keys_path, "shop", ["events:write"], callback_url=receiver.url("shop-default"))
    secret = key_callback(keys_path, kid)["callback_secret"]
    refused_port = free_port()  # loopback, not allowed: the SSRF guard refuses it
    pipe = Pipeline(redis_url, tmp_path, config=COMPRESSED, NOTIFY_CALLBACK_ALLOW=f"127.0.0.1:{receiver.port}")
    try:
        pipe.preferences([
            {"user_id": "u1", "phone": "+15550001234", "email": "x0001@example.com", "version": 1},  # email fails
            {"user_id": "u2", "phone": "+15550002222", "version": 1},  # no e-mail address: FILTERED
        ])
        metrics_port = free_port()
        pipe.start("w1")

        def event(biz, **kw):
            return dict({"biz_key": biz, "category": "transaction", "template": "order_shipped", "producer": "shop",
                         "recipients": ["u1", "u2"], "channels": ["sms", "email", "inbox"], "params": SHIPPED}, **kw)

        # 1. the endpoint is up: an event's own URL, and the producer's default
        pipe.events([event("cb:own", callback_url=receiver.url("own")), event("cb:default")])
        pipe.events([event("cb:refused", callback_url=f"http://127.0.0.1:{refused_port}/cb")])
        pipe.events([event("cb:none", producer="")])  # the operator's: no URL, no default

        def complete(biz_keys, sms=("DELIVERED",)):
            def check():
                want = _outcome_ids(redis_url, set(biz_keys), pipe.partitions)
                got = receiver.verified(secret)
                rows = pipe.rows()
                done = all(rows.get((b, u, "sms"), {}).get("status") in sms for b in biz_keys for u in ("u1", "u2"))
                ok = done and all(want.get(b) and want[b] <= {i for i, c in got.items() if c["biz_key"] == b}
                                  for b in biz_keys)
                return (want, got) if ok else None
            return check

        want, got = wait_until(complete(["cb:own", "cb:default"]), 90, 0.3, "every change of both events")
        for b in ("cb:own", "cb:default"):
            states = {i.split(".")[-2] for i in want[b]}
            assert {"PENDING", "ACCEPTED", "DELIVERED", "FAILED", "FILTERED"} <= states, states
        # each went to its own URL, and nothing was made up
        paths = {(orjson.loads(b)["biz_key"], path) for _h, b, path in receiver.requests}
        assert paths == {("cb:own", "/own"), ("cb:default", "/shop-default")}
        want = _outcome_ids(redis_url, {"cb:own", "cb:default"}, pipe.partitions)
        assert set(receiver.verified(secret)) == want["cb:own"] | want["cb:default"]
        # only the changes a producer hears of are read back: notify.callbacks holds those of
        # the events with a target, each as on the outcome stream, and none of the others'
        wait_until(lambda: _outcome_ids(redis_url, {"cb:none"}, pipe.partitions).get("cb:none"), 30, 0.3,
                   "the outcomes of the event without a target")
        on_callbacks = _outcome_ids(redis_url, None, pipe.partitions, topic="notify.callbacks")
        after = _outcome_ids(redis_url, {"cb:own", "cb:default"}, pipe.partitions)
        assert "cb:none" not in on_callbacks
        for b in ("cb:own", "cb:default"):
            assert want[b] <= on_callbacks[b] <= after[b]

        # the refused URL: given up at once, listed, replayable
        failed = wait_until(lambda: _cli(redis_url, "callbacks", "ls", "--failed") or None, 30, 0.3, "given up")
        assert failed[0]["biz_key"] == "cb:refused" and failed[0]["last_error"].startswith("target_refused")
        assert all(f["biz_key"] == "cb:refused" for f in failed)  # one per take of its outcomes
        replayed = _cli(redis_url, "callbacks", "replay")
        assert replayed[0]["replayed"] >= len(failed) and replayed[0]["due_now"] == 0
        wait_until(lambda: _cli(redis_url, "callbacks", "ls", "--failed") or None, 30, 0.3, "given up again")

        # 2. the endpoint goes down for "10 minutes" (6 s at 1/100), and the worker is killed meanwhile
        receiver.down()
        seen = len(receiver.requests)
        down_at = time.monotonic()
        pipe.events([event("cb:down", callback_url=receiver.url("own"))])

        def retrying():
            return [w for w in _cli(redis_url, "callbacks", "ls") if w["biz_key"] == "cb:down" and w["attempts"] >= 2]
        wait_until(retrying, 30, 0.3, "retries while the endpoint is down")
        pipe.procs[0].send_signal(signal.SIGKILL)
        pipe.procs[0].wait(10)
        pipe.start("w2", NOTIFY_METRICS_PORT=metrics_port)

        def w2_retried():
            try:
                return _metrics(metrics_port).get("notify_callbacks_retries_total", 0) >= 1
            except OSError:
                return False
        wait_until(w2_retried, 60, 0.3, "the new worker retries too")
        time.sleep(max(0.0, 6.0 - (time.monotonic() - down_at)))
        assert len(receiver.requests) == seen
        receiver.up()
        # (the in-process fake provider that took the SMS died with w1: no receipt poll answers for it)
        want, got = wait_until(complete(["cb:down"], sms=("ACCEPTED", "DELIVERED")), 90, 0.3,
                               "every change of the event sent while down")
        # every change of every event exactly once after de-duplication by its id (the wire may carry
        # one twice: w1's outcomes read again by w2), nothing that is not an outcome's
        time.sleep(1.0)
        want = _outcome_ids(redis_url, {"cb:own", "cb:default", "cb:down"}, pipe.partitions)
        got = receiver.verified(secret)
        assert set(got) == want["cb:own"] | want["cb:default"] | want["cb:down"]
        ids_on_wire = [c["id"] for _h, b, _p in receiver.requests for c in orjson.loads(b)["changes"]]
        assert set(ids_on_wire) == set(got) and len(ids_on_wire) >= len(got)
        wait_until(lambda: not [w for w in _cli(redis_url, "callbacks", "ls") if w["biz_key"] != "cb:refused"],
                   30, 0.3, "nothing left waiting")
        m = wait_until(lambda: (lambda m: m if m.get("notify_callbacks_sent_total", 0) > 0 else None)(
            _metrics(metrics_port)), 20, 0.5, "metrics")
        assert m["notify_callbacks_sent_total"] >= len(want["cb:down"])
        assert m["notify_callbacks_retries_total"] >= 1
        assert "notify_callbacks_lag_seconds{stage=\"send\"}" in m and "notify_callbacks_pending" in m
        # a forged or altered callback does not verify
        headers, body, _path = receiver.requests[-1]
        with pytest.raises(WebhookVerificationError):
            Webhook(secret).verify(body.replace(b"notification.status", b"notification.forged"), headers)
    finally:
        pipe.stop()
