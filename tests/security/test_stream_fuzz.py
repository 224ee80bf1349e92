"""Hostile entries written straight into every topic an agent reads, against a
real worker process (the protocol simulators behind the real adapters):

* each bad entry (bad JSON, binary garbage, empty and missing values, wrong
  types, unknown schema versions, 2 MB payloads, a key that is not the user's,
  a key that is not UTF-8, values that would crash an agent further on) ends up
  on notify.dlq with its source and reason, and nothing else does;
* the worker never crashes (no agent restart, no traceback) and the good
  preferences, device updates and events sent in between all reach their
  records; nothing hostile creates a record, except a delivery written
  straight to a lane whose address is not one of its channel: it ends FAILED
  ``bad_address`` before any call (dead-lettered), never PENDING
  (tests/security/test_addresses.py);
* webhook targets in private, link-local and disguised ranges are refused
  before any connection (FAILED ``target_refused``, dead-lettered) even though
  the simulators' receiver on 127.0.0.1 is allowed;
* no phone number, e-mail address or push token reaches the worker's log (the
  dead-letter lines that quote a hostile value show it masked).
"""

from __future__ import annotations

import time
from collections import Counter

import orjson
import pytest

from pipeline.ids import delivery_id, notification_id
from tests.pipeline.harness import PARTITIONS, Pipeline
from tests.transport.helpers import wait_until

EV = "notify.events"
PREFS = "notify.preferences"
DEV = "notify.devices"
RCPT = "notify.receipts"
TIMERS = "notify.timers"
HUGE = 2_000_000

GOOD_USERS = [f"fz-g{i}" for i in range(6)]
PHONES = {u: f"+1555987{i:04d}" for i, u in enumerate(GOOD_USERS)}
EMAILS = {u: f"good.person{i}@example.com" for i, u in enumerate(GOOD_USERS)}
DEVICE_USER = "fz-d0"
TOKEN = "a7" * 32
SSRF = {
    "fz-s0": "http://169.254.169.254/latest/meta-data/iam",
    "fz-s1": "http://10.0.0.1/hook",
    "fz-s2": "http://[::ffff:10.0.0.1]/hook",  # an IPv4-mapped disguise of a private address
    "fz-s3": "http://192.168.1.20:8080/hook",
}
#: hostile values that the dead-letter detail quotes: they must show masked
LEAK_PHONE = "+15550009876"
LEAK_EMAIL = "carol.secret@example.com"
LEAK_TOKEN = "fcm:" + "Zq9_" * 40


def j(obj) -> bytes:
    return orjson.dumps(obj)


def event(biz: str, users: list[str], channels: list[str], **kw) -> dict:
    return {"biz_key": biz, "category": "transaction", "template": "order_shipped", "recipients": users,
            "channels": channels, "accepted_at": time.time(),
            "params": {"order_no": biz[-8:], "carrier": "UPS", "tracking_no": "1Z", "tracking_url": "https://t.example/x"},
            **kw}


def intent(user: str, **kw) -> dict:
    return {"notification_id": notification_id("fz:i", user), "biz_key": "fz:i", "user_id": user,
            "category": "transaction", "template": "order_shipped", "template_version": 1, "priority": "normal",
            "params": {}, **kw}


def delivery(user: str, channel: str = "sms", address: str = "+15550001111", **kw) -> dict:
    return {"delivery_id": delivery_id("fz:d", user, channel), "notification_id": notification_id("fz:d", user),
            "biz_key": "fz:d", "user_id": user, "channel": channel, "category": "transaction",
            "template": "order_shipped", "priority": "high", "address": address, "content": {"body": "x"}, **kw}


class Bad:
    """Hostile entries per topic and the dead letters they must become."""

    def __init__(self) -> None:
        self.by_topic: dict[str, list[tuple]] = {}
        self.expected: Counter = Counter()

    def add(self, topic: str, key, value, reason: str, source: str | None = None) -> None:
        self.by_topic.setdefault(topic, []).append((key, value))
        self.expected[(source or topic, reason)] += 1

    def common(self, topic: str, key: bytes, valid: dict) -> None:
        """What every typed topic must survive."""
        self.add(topic, key, b"{nope", "bad_json")
        self.add(topic, key, b"\xff\xfe\x00\x01garbage\x80", "bad_json")
        self.add(topic, key, b"", "bad_json")
        self.add(topic, key, None, "empty")
        self.add(topic, key, b"[1, 2, 3]", "not_an_object")
        self.add(topic, key, j({**valid, "v": 99}), "unknown_version")
        self.add(topic, key, j({**valid, "v": "1"}), "wrong_type")
        self.add(topic, key, j({**valid, "junk": "x" * HUGE}), "oversized")
        self.add(topic, b"\xff\xfekey", j(valid), "bad_key")


def bad_entries() -> Bad:
    b = Bad()
    k = b"fz-x"
    # -- notify.events (raw bytes; the expand agent validates): source "expand"
    ok = event("fz:bad", ["fz-x"], ["inbox"])
    for value, reason in [
        (b"{nope", "bad_json"), (b"\xff\xfe\x00\x01garbage\x80", "bad_json"), (b"", "bad_json"), (None, "bad_json"),
        (b"[1]", "not_an_object"), (j({**ok, "v": 99}), "unknown_version"), (j({**ok, "recipients": "fz-x"}), "wrong_type"),
        (j({**ok, "recipients": [f"u{i}" for i in range(10_001)]}), "too_many_recipients"),
        (j({**ok, "params": {"a": [[[[[[[[1]]]]]]]]}}), "params_too_deep"),
        (j({**ok, "params": {"blob": "x" * 70_000}}), "params_too_large"),
        (j({**ok, "params": {"blob": "x" * HUGE}}), "oversized"),
        (j({**ok, "category": LEAK_EMAIL}), "unknown_category"),
        (j({**ok, "send_at": "tomorrow"}), "wrong_type"),
    ]:
        b.add(EV, b"bad", value, reason, source="expand")
    # -- notify.preferences
    b.common(PREFS, k, {"user_id": "fz-x"})
    b.add(PREFS, k, j({"user_id": "fz-x", "version": "7"}), "wrong_type")
    b.add(PREFS, k, j({"user_id": "fz-x", "tz": LEAK_PHONE}), "bad_timezone")
    b.add(PREFS, k, j({"user_id": "fz-x", "quiet_hours": "25:00-07:00"}), "bad_quiet_hours")
    b.add(PREFS, k, j({"user_id": "fz-x", "switches": {"marketing.fax": False}}), "unknown_channel")
    b.add(PREFS, k, j({"user_id": "fz-x", "email": "x@y\r\nBcc: z@w.com"}), "bad_value")
    b.add(PREFS, k, j({"user_id": "someone-else"}), "wrong_key")
    # -- notify.devices
    b.common(DEV, k, {"user_id": "fz-x", "token": "t1"})
    b.add(DEV, k, j({"user_id": "fz-x"}), "missing_field")
    b.add(DEV, k, j({"user_id": "fz-x", "token": "a b\r\n"}), "bad_value")
    b.add(DEV, k, j({"user_id": "fz-x", "token": LEAK_TOKEN, "platform": "sms"}), "bad_value")
    # -- notify.receipts
    r = {"provider": "twilio", "provider_msg_id": "SMfz", "status": "DELIVERED", "at": 1.0}
    b.common(RCPT, b"SMfz", r)
    b.add(RCPT, b"SMfz", j({**r, "provider": 1}), "wrong_type")
    b.add(RCPT, b"SMfz", j({**r, "status": "SENT"}), "bad_value")
    b.add(RCPT, b"SMfz", j({**r, "provider_msg_id": " "}), "bad_value")
    # -- notify.timers (a bad one would crash the scheduler when due, or its heap now)
    t = {"timer_id": "fz:t", "due_at": 1.0, "kind": "fire", "payload": {}}
    b.common(TIMERS, k, t)
    b.add(TIMERS, k, j({**t, "due_at": "soon"}), "wrong_type")
    b.add(TIMERS, k, j({**t, "kind": "intent"}), "missing_field")
    b.add(TIMERS, k, j({**t, "kind": "nope"}), "bad_value")
    b.add(TIMERS, k, j({**t, "kind": "delivery", "payload": delivery("fz-x", channel="fax")}), "bad_value")
    b.add(TIMERS, k, j({**t, "kind": "receipt", "payload": {"receipt": {"provider": "x"}, "tries": 1}}), "missing_field")
    # -- notify.outcomes: no agent reads it (the worker that makes an outcome writes
    # its record: agents/sink.py); `notify records replay` skips what is not an
    # outcome (tests/cli/test_cli.py)
    # -- notify.intents.<priority>
    for prio in ("high", "normal", "low"):
        topic = f"notify.intents.{prio}"
        b.common(topic, k, intent("fz-x"))
    it = "notify.intents.normal"
    b.add(it, k, j(intent("fz-x", priority="urgent")), "bad_value")
    b.add(it, k, j(intent("fz-x", category="carol.secret@example.com")), "unknown_category")
    b.add(it, k, j(intent("fz-x", params={"a": [[[[[[[[1]]]]]]]]})), "params_too_deep")
    b.add(it, k, j(intent("someone-else")), "wrong_key")
    # -- the lanes
    for lane in ("notify.send.sms.high", "notify.send.email.low", "notify.send.push.normal", "notify.send.webhook.normal"):
        channel = lane.split(".")[2]
        b.common(lane, k, delivery("fz-x", channel=channel, address=""))
    # an address that is not one of the channel's: FAILED at the send, with a record
    b.add("notify.send.email.low", k, j(delivery("fz-x", "email", "x@example.com\r\nBcc: all@example.com",
                                                 priority="low")), "bad_address", source="lane")
    b.add("notify.send.sms.high", k, j(delivery("fz-x", content={"body": {"x": 1}})), "wrong_type")
    b.add("notify.send.sms.high", k, j(delivery("fz-x", channel="fax")), "bad_value")
    b.add("notify.send.sms.high", k, j(delivery("fz-x", delivery_id="n_1.sms\r\nX-Evil: 1")), "bad_value")
    b.add("notify.send.push.normal", k, j(delivery("fz-x", "push", "apns:" + TOKEN, priority="urgent")), "bad_value")
    b.add("notify.send.webhook.normal", k, j(delivery("fz-x", "webhook", "gopher://10.0.0.1/x",
                                                      priority="normal")), "bad_address", source="lane")
    return b


def interleave(a: list, b: list) -> list:
    out = []
    for i in range(max(len(a), len(b))):
        out += a[i:i + 1] + b[i:i + 1]
    return out


def dead_letters(redis_sync) -> list[dict]:
    out = []
    for p in range(PARTITIONS):
        out += [orjson.loads(f[b"v"]) for _id, f in redis_sync.xrange(f"nfs:{{notify.dlq|{p}}}:s")]
    return out


@pytest.fixture
def pipe(redis_url, tmp_path):
    p = Pipeline(redis_url, tmp_path, NOTIFY_PROVIDERS="simulators")
    yield p
    p.stop()


def test_hostile_entries_are_dead_lettered_and_nothing_else_is_lost(pipe, redis_sync):
    bad = bad_entries()
    proc = pipe.start()
    wait_until(lambda: "Worker ready" in pipe.log() or proc.poll() is not None, 60, 0.1, "the worker ready")

    # users first: each good update is followed, in its own partition, by a bad one,
    # so once every bad one is dead-lettered every good one has been applied
    prefs = []
    for u in GOOD_USERS:
        prefs += [(u.encode(), j({"user_id": u, "version": 1, "phone": PHONES[u], "email": EMAILS[u]})),
                  (u.encode(), j({"user_id": u, "phone": "call me"}))]
    for u, url in SSRF.items():
        prefs += [(u.encode(), j({"user_id": u, "version": 1, "webhook_url": url})),
                  (u.encode(), j({"user_id": u, "phone": "call me"}))]
    pipe.send(PREFS, interleave(prefs, bad.by_topic.pop(PREFS)))
    bad.expected[(PREFS, "bad_value")] += len(prefs) // 2
    devs = [(DEVICE_USER.encode(), j({"user_id": DEVICE_USER, "token": TOKEN, "platform": "apns", "at": time.time()})),
            (DEVICE_USER.encode(), j({"user_id": DEVICE_USER, "token": TOKEN, "op": "nuke"}))]
    bad.expected[(DEV, "bad_value")] += 1
    pipe.send(DEV, interleave(devs, bad.by_topic.pop(DEV)))

    def alive() -> None:
        log = pipe.log()
        assert proc.poll() is None and "Crashed" not in log, log[-4000:]

    def users_done():
        alive()
        got = Counter((d["source"], d["reason"]) for d in dead_letters(redis_sync))
        return all(got[key] >= n for key, n in bad.expected.items() if key[0] in (PREFS, DEV))

    wait_until(users_done, 60, 0.2, "the preference and device entries processed")

    # events: good ones before, between and after the hostile entries of every topic
    good = []

    def good_round(r: int) -> None:
        evs = [event(f"fz:good:{r}:{i}", [u], ["inbox"]) for i, u in enumerate(GOOD_USERS)]
        good.extend(evs)
        pipe.events(evs)

    good_round(0)
    pipe.send(EV, bad.by_topic.pop(EV))
    good_round(1)
    for topic, items in bad.by_topic.items():
        pipe.send(topic, items)
    pipe.events([event("fz:push:0", [DEVICE_USER], ["push"]), event("fz:ssrf:0", list(SSRF), ["webhook"])])
    good_round(2)

    expected_rows = {(e["biz_key"], e["recipients"][0], "inbox"): "DELIVERED" for e in good}
    expected_rows[("fz:push:0", DEVICE_USER, "push")] = "ACCEPTED"
    expected_rows.update({("fz:ssrf:0", u, "webhook"): "FAILED" for u in SSRF})
    bad_address = {("fz:d", "fz-x", "email"), ("fz:d", "fz-x", "webhook")}  # written straight to a lane
    expected_rows.update({k: "FAILED" for k in bad_address})
    for u in SSRF:
        bad.expected[("lane", "target_refused")] += 1

    def settled():
        alive()
        rows = pipe.rows()
        ok = all(rows.get(k, {}).get("status") in ((s, "DELIVERED") if s == "ACCEPTED" else (s,))
                 for k, s in expected_rows.items())
        return rows if ok and len(dead_letters(redis_sync)) >= sum(bad.expected.values()) else None

    try:
        rows = wait_until(settled, 90, 0.3, "good records terminal and every bad entry dead-lettered")
    finally:
        log = pipe.log()
    time.sleep(0.5)  # anything late (a duplicate dead letter, a crash) shows now
    assert proc.poll() is None, log[-3000:]

    # every bad entry is on the DLQ with its source and reason, and nothing else is
    letters = dead_letters(redis_sync)
    got = Counter((d["source"], d["reason"]) for d in letters)
    assert got == bad.expected, {"missing": bad.expected - got, "unexpected": got - bad.expected}
    assert all(d["detail"] for d in letters if d["source"] != "lane")
    assert all(len(d["payload"]) <= 65536 for d in letters)

    # the good ones all reached their records; nothing hostile created one but the
    # bad addresses written straight to a lane (FAILED bad_address, never PENDING)
    assert set(rows) == set(expected_rows), set(rows) ^ set(expected_rows)
    for key in (k for k in expected_rows if k[0].startswith("fz:ssrf")):
        assert rows[key]["reason"] == "target_refused", rows[key]
    for key in bad_address:
        assert rows[key]["reason"] == "bad_address", rows[key]
    assert {d["key"] for d in letters if d["source"] == "lane"} == (
        {delivery_id("fz:ssrf:0", u, "webhook") for u in SSRF} | {delivery_id(*k) for k in bad_address})

    # no agent crashed or was restarted
    for marker in ("Crashed", "Restarting dead", "Traceback"):
        assert marker not in log, log[log.index(marker) - 2000: log.index(marker) + 2000]

    # recipients never in the log; the quoted hostile values show masked
    for secret in [*PHONES.values(), *EMAILS.values(), TOKEN, LEAK_PHONE, LEAK_EMAIL, LEAK_TOKEN, LEAK_TOKEN[4:]]:
        assert secret not in log, secret
    assert "+15*******76" in log and "c***@example.com" in log
