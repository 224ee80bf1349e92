"""Hostile addresses (issue 26), on real servers: the embedded valkey, the
provider simulators in a process of their own and a worker pointed at them as
``notify run`` starts them (the default setup), the real API app, and real
HTTP receivers on 127.0.0.1.

1. A user's webhook URL on this machine, in any spelling (``localhost``, names
   from /etc/hosts, ``2130706433``, ``0177.0.0.1``, ``0x7f.1``, ``[::1]``,
   ``[::ffff:127.0.0.1]``, ``0.0.0.0``), reaches the receiver simulator and no
   other port: not a local service, not the API, not the broker, not another
   simulator's control endpoint (FAILED ``target_refused``, no request made).
2. An address with a space or a control character is refused at the door (400
   at the preferences and devices PUTs, with the same check the lane makes);
   one that gets past the door anyway (stored before the check was tightened,
   or written straight to a lane) ends FAILED ``bad_address`` at the send,
   without a provider call and without a retry, never PENDING.
3. Dead letters show no address in clear: not in their detail, key or reason,
   not in ``notify dlq ls``, not on the status page; the payload of a failed
   delivery stays whole in the stream because ``notify dlq replay`` sends it
   again (and does).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import quote, urlsplit

import orjson
import pytest
from aiohttp import web
from aiokafka.partitioner import DefaultPartitioner
from yarl import URL

from adapters.simulators import read_ledger
from pipeline.embedded import free_port
from pipeline.ids import delivery_id, notification_id
from pipeline.parsers.events import address_ok
from tests.cli.test_cli import notify
from tests.pipeline.harness import PARTITIONS, Pipeline
from tests.pipeline.http_thread import serve
from tests.transport.helpers import ROOT, produce, wait_until
from pipeline.procs import stop_process

PARAMS = {"order_no": "A1", "carrier": "UPS", "tracking_no": "1Z", "tracking_url": "https://t.example/x"}
TERMINAL = ("FAILED", "ACCEPTED", "DELIVERED", "REVIEW", "FILTERED")


def event(biz: str, users: list[str], channels: list[str]) -> dict:
    return {"biz_key": biz, "category": "transaction", "template": "order_shipped", "recipients": users,
            "channels": channels, "params": PARAMS}


def of(key, delivery_ids: set[str]):
    """The delivery id among ``delivery_ids`` that ``key`` is (or one of its per-device ids)."""
    if not isinstance(key, str):
        return None
    return next((i for i in delivery_ids if key == i or key.startswith(i + ".")), None)


def partition_of(user: str) -> int:
    parts = list(range(PARTITIONS))
    return DefaultPartitioner()(user.encode(), parts, parts)


def dead_letters(redis_sync) -> list[dict]:
    out = []
    for p in range(PARTITIONS):
        out += [orjson.loads(f[b"v"]) for _id, f in redis_sync.xrange(f"nfs:{{notify.dlq|{p}}}:s")]
    return out


class Sims:
    """The provider simulators in a process of their own (``python -m
    adapters.simulators --info``), as ``notify run`` starts them."""

    def __init__(self, tmp: Path) -> None:
        self.info_path = tmp / "simulators.json"
        self.ledger_path = tmp / "ledger.jsonl"
        self.log = open(tmp / "simulators.log", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "adapters.simulators", "--clean", "--info", str(self.info_path),
             "--ledger", str(self.ledger_path)],
            cwd=str(ROOT), env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.DEVNULL, stderr=self.log)
        wait_until(lambda: self.info_path.exists() or self.proc.poll() is not None, 30, 0.1, "the simulators")
        assert self.proc.poll() is None, (tmp / "simulators.log").read_text()
        self.info = orjson.loads(self.info_path.read_bytes())

    def port(self, name: str) -> int:
        url = self.info["webhook"]["url"] if name == "webhook" else self.info[name]["base_url"]
        return urlsplit(url).port

    def calls(self, delivery_ids: set[str]) -> list[dict]:
        """Provider calls for these deliveries (a push delivery's id may carry a suffix per device)."""
        return [row for row in read_ledger(str(self.ledger_path)) if of(row.get("key"), delivery_ids)]

    def stop(self) -> None:
        stop_process(self.proc, 15)
        self.log.close()


class Api:
    """``notify api`` (the real app) in a process of its own, on the pipeline's broker."""

    def __init__(self, pipe: Pipeline) -> None:
        self.port = free_port()
        self.log_path = pipe.tmp / "api.log"
        self.proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "api", "--port", str(self.port)],
                                     cwd=str(ROOT), env=dict(os.environ, **pipe.env),
                                     stdout=open(self.log_path, "ab"), stderr=subprocess.STDOUT)
        wait_until(self._up, 30, 0.2, "the API")

    def _up(self) -> bool:
        assert self.proc.poll() is None, self.log()
        try:
            return self.get("/healthz") is not None
        except OSError:
            return False

    def get(self, path: str) -> bytes:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as resp:
            return resp.read()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        stop_process(self.proc, 15)


@pytest.fixture
def sims(tmp_path):
    s = Sims(tmp_path)
    yield s
    s.stop()


@pytest.fixture
def pipe(redis_url, tmp_path, sims):
    """A worker of the default setup: the real adapters, pointed at the simulators' process."""
    p = Pipeline(redis_url, tmp_path, NOTIFY_PROVIDERS="simulators", NOTIFY_SIMULATORS=str(sims.info_path))
    yield p
    p.stop()


def start(pipe: Pipeline):
    proc = pipe.start()
    wait_until(lambda: "Worker ready" in pipe.log() or proc.poll() is not None, 60, 0.1, "the worker ready")
    assert proc.poll() is None, pipe.log()[-3000:]
    return proc


# ------------------------------------------------------------------ 1. webhook targets on this machine


def hosts_file_names() -> list[str]:
    """The names /etc/hosts gives a loopback address (``localhost``, this machine's name …)."""
    names: list[str] = []
    try:
        lines = Path("/etc/hosts").read_text().splitlines()
    except OSError:
        return names
    for line in lines:
        fields = line.split("#", 1)[0].split()
        if len(fields) > 1 and (fields[0].startswith("127.") or fields[0] == "::1"):
            names += [n for n in fields[1:] if n not in names and n != "localhost"]
    return names[:4]


def loopback_spellings(port: int) -> list[str]:
    hosts = ["localhost", "LOCALHOST.", "127.0.0.1", "127.1", "2130706433", "0177.0.0.1", "0x7f.1", "0x7f000001",
             "[::1]", "[::ffff:127.0.0.1]", "[::ffff:7f00:1]", "0.0.0.0", "[::]", *hosts_file_names()]
    return [f"http://{h}:{port}/hook/ok" for h in hosts]


def test_webhooks_in_the_default_setup_reach_the_simulator_and_no_other_local_port(pipe, sims, redis_url):
    """The attacker: a user (or an app with users:write) who sets their own
    webhook URL. In the default setup the simulators' allowlist used to be all of
    127.0.0.0/8 and ::1, so the worker POSTed signed requests to any port of the
    machine: the broker, the API, a local admin service, the SMS simulator's
    /_sim/mode. Now only the receiver simulator's own address and port pass."""
    calls: list[str] = []

    async def anything(request: web.Request) -> web.Response:
        calls.append(f"{request.method} {request.path}")
        return web.json_response({"ok": True})

    local = serve(web.route("*", "/{tail:.*}", anything))  # a service on this machine
    api = Api(pipe)
    try:
        targets = {"local service": local, "api": api.port, "broker": urlsplit(redis_url).port,
                   "sms simulator": sims.port("twilio")}
        hooks: dict[str, tuple[str, str]] = {}
        for target, port in targets.items():
            for n, url in enumerate(loopback_spellings(port)):
                hooks[f"ad-{target.replace(' ', '-')}-{n}"] = (target, url)
        sim = sims.info["webhook"]["url"]
        good = {"ad-sim": sim, "ad-sim-decimal": sim.replace("127.0.0.1", "2130706433")}
        pipe.preferences([{"user_id": u, "version": 1, "webhook_url": url}
                          for u, url in [*good.items(), *((u, t[1]) for u, t in hooks.items())]])
        start(pipe)
        pipe.events([event("ad:hook", [*good, *hooks], ["webhook"])])

        def settled(rows):
            mine = [rows.get(("ad:hook", u, "webhook"), {}).get("status") for u in [*good, *hooks]]
            return all(s in TERMINAL for s in mine) or calls
        rows = pipe.wait_rows(settled, 90, "every webhook delivery settled")

        assert calls == [], f"a local service was called: {calls}"
        assert "POST /hook" not in api.log(), api.log()[-2000:]
        for u in good:
            assert rows[("ad:hook", u, "webhook")]["status"] in ("ACCEPTED", "DELIVERED"), rows[("ad:hook", u, "webhook")]
        wrong = {u: (hooks[u], rows[("ad:hook", u, "webhook")]["status"], rows[("ad:hook", u, "webhook")]["reason"])
                 for u in hooks if (rows[("ad:hook", u, "webhook")]["status"], rows[("ad:hook", u, "webhook")]["reason"])
                 != ("FAILED", "target_refused")}
        assert not wrong, wrong
        # the receiver simulator got exactly the two allowed deliveries; no other simulator got any
        ids = {delivery_id("ad:hook", u, "webhook") for u in [*good, *hooks]}
        got = sims.calls(ids)
        assert sorted(of(r["key"], ids) for r in got) == sorted(delivery_id("ad:hook", u, "webhook") for u in good), got
    finally:
        api.stop()


# ------------------------------------------------------------------ 2. control characters and spaces


PREFS_REFUSED = [
    ({"webhook_url": "https://hooks.example/a b"}, "webhook_url", ("webhook", "https://hooks.example/a b")),
    ({"webhook_url": "https://hooks.example/a\r\nX-Evil: 1"}, "webhook_url",
     ("webhook", "https://hooks.example/a\r\nX-Evil: 1")),
    ({"webhook_url": "https://hooks.example/a\n"}, "webhook_url", ("webhook", "https://hooks.example/a\n")),
    ({"webhook_url": "https://hooks .example/"}, "webhook_url", ("webhook", "https://hooks .example/")),
    ({"email": "carol\x00@example.com"}, "email", ("email", "carol\x00@example.com")),
    ({"email": "carol@example.com\n"}, "email", ("email", "carol@example.com\n")),
    ({"phone": "+15550001234\n"}, "phone", ("sms", "+15550001234\n")),
    ({"phone": "+1555\x000001234"}, "phone", ("sms", "+1555\x000001234")),
    ({"locale": "en\n"}, "locale", None),
    ({"quiet_hours": "22:00-07:00\n"}, "quiet_hours", None),
    ({"quiet_hours": "22:00\t-07:00"}, "quiet_hours", None),
]
TOKENS_REFUSED = ["a7" * 32 + "\n", "a7" * 32 + "\r\nx", "tok en", "tok\x00en"]


def stream_len(redis_sync, topic: str) -> int:
    return sum(redis_sync.xlen(f"nfs:{{{topic}|{p}}}:s") for p in range(PARTITIONS))


async def test_addresses_with_a_space_or_a_control_character_are_refused_at_the_door(api, redis_sync):
    """The attacker: an app (or a user through it) with users:write. A webhook URL
    with a space or a line break, an e-mail address with a NUL, a device token,
    locale or quiet hours with a trailing newline used to be accepted (202) and
    then dead-lettered or retried by the worker, the record PENDING forever; they
    are refused at the PUT now, with the check the lane makes at the send."""
    for body, field, lane_check in PREFS_REFUSED:
        status, resp = await api.call("PUT", "/v1/users/ad-door/preferences", json=body)
        assert status == 400, (body, status, resp)
        assert resp["error"]["field"] == field, (body, resp)
        if lane_check:  # the same verdict at the door and at the send
            assert not address_ok(*lane_check), lane_check
    for token in TOKENS_REFUSED:
        path = URL(f"{api.url}/v1/users/ad-door/devices/{quote(token, safe='')}", encoded=True)
        async with api.http.put(path, headers=api.h("all"), json={"platform": "apns"}) as resp:
            assert resp.status == 400, (token, resp.status, await resp.text())
        assert not address_ok("push", "apns:" + token)
    assert stream_len(redis_sync, "notify.preferences") == 0 and stream_len(redis_sync, "notify.devices") == 0

    # the same addresses, clean, pass (trimmed; spaces in a phone number are separators)
    ok = {"webhook_url": "https://hooks.example/a%20b", "email": " carol@example.com ", "phone": "+1 555 000 1234",
          "locale": "en", "quiet_hours": "22:00 - 07:00"}
    status, resp = await api.call("PUT", "/v1/users/ad-door/preferences", json=ok)
    assert status == 202, resp
    assert (resp["email"], resp["phone"], resp["quiet_hours"]) == ("carol@example.com", "+15550001234", "22:00-07:00")
    status, resp = await api.call("PUT", "/v1/users/ad-door/devices/" + "a7" * 32, json={"platform": "apns"})
    assert status == 202, resp


def test_an_address_that_fails_at_the_send_ends_failed_bad_address_never_pending(pipe, sims, redis_url, redis_sync):
    """An address the door would refuse now can still reach a lane: stored by a
    version before this check (the tables' changelogs keep it), or written
    straight to a lane topic. It used to be dead-lettered when the lane decoded it
    (the record PENDING forever) or sent and retried as a transient error; now the
    lane refuses it before any provider call: FAILED ``bad_address``, one attempt,
    no retry."""
    hook = sims.info["webhook"]["url"]
    stored = {  # preferences as an older version stored them, in the table's changelog
        "bs-web": {"webhook_url": hook + " x"},
        "bs-mail": {"email": "bs\x00mail@example.com"},
        "bs-sms": {"phone": "+15550001234\n"},
    }
    for user, fields in stored.items():
        value = {"user_id": user, "version": 1, "switches": {}, "quiet_hours": None, "tz": "UTC", "phone": None,
                 "email": None, "webhook_url": None, "locale": None, "v": 1, **fields}
        produce(redis_url, "notify-preferences-changelog", [(orjson.dumps(user), orjson.dumps(value))],
                partition=partition_of(user))
    produce(redis_url, "notify-devices-changelog",
            [(orjson.dumps("bs-push"), orjson.dumps([["apns", "a7" * 32 + "\n", 1.0]]))], partition=partition_of("bs-push"))
    start(pipe)
    channel_of = {"bs-web": "webhook", "bs-mail": "email", "bs-sms": "sms", "bs-push": "push"}
    for user, channel in channel_of.items():
        pipe.events([event(f"bs:{user}", [user], [channel])], after_users=False)
    # a delivery written straight to a lane (by a producer, or planned before the check)
    lane_user = "bs-lane"
    d = {"delivery_id": delivery_id("bs:lane", lane_user, "webhook"), "notification_id": notification_id("bs:lane", lane_user),
         "biz_key": "bs:lane", "user_id": lane_user, "channel": "webhook", "category": "transaction",
         "template": "order_shipped", "priority": "normal", "address": hook + "\r\nX-Evil: 1", "content": {"body": "{}"}}
    pipe.send("notify.send.webhook.normal", [(lane_user.encode(), orjson.dumps(d))])

    keys = {(f"bs:{u}", u, c) for u, c in channel_of.items()} | {("bs:lane", lane_user, "webhook")}
    rows = pipe.wait_rows(lambda r: all(r.get(k, {}).get("status") in TERMINAL for k in keys), 60,
                          "every bad address settled")
    wrong = {k: (rows[k]["status"], rows[k]["reason"]) for k in keys if (rows[k]["status"], rows[k]["reason"])
             != ("FAILED", "bad_address")}
    assert not wrong, wrong
    ids = {rows[k]["delivery_id"] for k in keys}
    # refused once, never retried (the attempts are written beside the records: wait for them)
    def attempts() -> dict[str, int]:
        got = pipe.attempts()
        return {i: sum(n for a, n in got.items() if a == i or a.startswith(i + ".")) for i in ids}
    wait_until(lambda: all(attempts().values()), 30, 0.2, "the attempts recorded")
    time.sleep(1.5)
    assert attempts() == {i: 1 for i in ids}
    assert {k: (r["status"], r["retry_count"]) for k, r in pipe.rows().items() if k in keys} == \
        {k: ("FAILED", 1) for k in keys}
    assert sims.calls(ids) == []  # no provider saw any of them
    letters = [dl for dl in dead_letters(redis_sync) if dl["source"] == "lane"]
    assert sorted(of(dl["key"], ids) for dl in letters) == sorted(ids), letters
    assert {dl["reason"] for dl in letters} == {"bad_address"}


# ------------------------------------------------------------------ 3. dead letters


SMS_PHONE = "+15005550001"  # the simulator refuses it for good (invalid number)
PUSH_TOKEN = "bad0" + "c4" * 30  # the simulator answers BadDeviceToken
HOOK_SECRET = "s3cr3tPathT0ken"
LEAK_PHONE = "+15550009876"
LEAK_EMAIL = "carol.secret@example.com"
LEAK_TOKEN = "fcm:" + "Zq9_" * 40
LEAK_PATH = "T0B0XyZsecretpath"


def test_dead_letters_show_no_address_in_clear_and_stay_replayable(pipe, sims, redis_sync):
    """The attacker here is whoever reads dead letters: an operator's terminal,
    a dashboard that polls the open status page, a support ticket with a pasted
    ``notify dlq ls``. Dead letters carried phone numbers, e-mail addresses, push
    tokens and webhook URLs (their secret paths included) in clear; now every
    field a person reads is masked, and only the payload of a failed delivery
    keeps its address, in the stream, because the replay sends it again."""
    hook = sims.info["webhook"]["url"].replace("/hook/ok", "/hook/gone") + f"?token={HOOK_SECRET}"
    pipe.preferences([{"user_id": "dl-sms", "version": 1, "phone": SMS_PHONE},
                      {"user_id": "dl-web", "version": 1, "webhook_url": hook}])
    pipe.devices([{"user_id": "dl-push", "token": PUSH_TOKEN, "platform": "apns", "at": 1.0}])
    # hostile updates written straight to the users' topics: dead-lettered, quoting what they carry
    hostile = [{"user_id": "dl-x", "phone": LEAK_PHONE, "tz": LEAK_PHONE},
               {"user_id": "dl-x", "email": LEAK_EMAIL, "quiet_hours": "nope"},
               {"user_id": "dl-x", "webhook_url": f"ftp://hooks.example/{LEAK_PATH}"}]
    pipe.send("notify.preferences", [(b"dl-x", orjson.dumps(h)) for h in hostile])
    pipe.send("notify.devices", [(b"dl-x", orjson.dumps({"user_id": "dl-x", "token": LEAK_TOKEN, "platform": "sms"}))])
    start(pipe)
    pipe.events([event("dl:1", ["dl-sms"], ["sms"]), event("dl:2", ["dl-push"], ["push"]),
                 event("dl:3", ["dl-web"], ["webhook"])])
    keys = [("dl:1", "dl-sms", "sms"), ("dl:2", "dl-push", "push"), ("dl:3", "dl-web", "webhook")]
    pipe.wait_rows(lambda r: all(r.get(k, {}).get("status") == "FAILED" for k in keys), 60, "the three failed for good")
    wait_until(lambda: len(dead_letters(redis_sync)) >= 7, 30, 0.2, "seven dead letters")
    letters = dead_letters(redis_sync)
    secrets = [SMS_PHONE, PUSH_TOKEN, HOOK_SECRET, LEAK_PHONE, LEAK_EMAIL, LEAK_TOKEN, LEAK_TOKEN[4:], LEAK_PATH]

    def clear(text) -> list[str]:
        return [s for s in secrets if s in str(text)]

    lane = [dl for dl in letters if dl["source"] == "lane"]
    assert len(lane) == 3 and len(letters) == 7, letters
    for dl in letters:  # detail, key, reason: masked in the stream itself
        assert not clear([dl.get("detail"), dl.get("key"), dl.get("reason")]), dl
        if dl["source"] != "lane":  # nothing replays these: the payload is masked too
            assert not clear(dl["payload"]), dl
    assert any("+15*******76" in (dl.get("detail") or "") for dl in letters), letters  # masked, not dropped
    # the payload of a failed delivery keeps its address: the replay needs it
    assert {orjson.loads(dl["payload"])["address"] for dl in lane} == {SMS_PHONE, "apns:" + PUSH_TOKEN, hook}

    env = dict(os.environ, **pipe.env)
    shown = notify(env, "dlq", "ls").stdout
    assert len(shown.splitlines()) == 7 and not clear(shown), shown
    assert "+15*******01" in shown and "apns:bad0…(64)" in shown and "/hook/gone" not in shown, shown

    api = Api(pipe)
    try:
        status = json.loads(api.get("/v1/status.json"))
        assert len(status["dead_letters"]) == 7 and not clear(json.dumps(status)), status["dead_letters"]
    finally:
        api.stop()
    assert not clear(pipe.log())

    # replayable as before: the webhook one reaches its receiver again, at its full URL
    out = json.loads(notify(env, "dlq", "replay", "--source", "lane").stdout)
    assert sum(out["replayed"].values()) == 3, out
    did = delivery_id("dl:3", "dl-web", "webhook")
    wait_until(lambda: len(sims.calls({did})) == 2, 30, 0.2, "the replayed webhook call")
    assert all(row["path"].endswith("/hook/gone") for row in sims.calls({did}))
