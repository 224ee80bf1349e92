"""Record look-ups (by id, paginated lists), preferences (read model +
notify.preferences), devices, the inbox."""

from __future__ import annotations

import time

import orjson
import redis
from aiokafka.partitioner import DefaultPartitioner

from pipeline import ids
from pipeline.models import Attempt, Outcome
from pipeline.store import InboxItem, RecordStore
from pipeline.transport.keys import Keys

#: the producer of the tests' keys (tests/api/conftest.py)
P = "test"

PARTITIONS = 4  # tests/api/conftest.py


def outcome(biz_key, user, channel, state, at, seq=None, **kw):
    """An outcome of the tests' producer (the keys' own: records:read shows only those)."""
    did = ids.delivery_id(biz_key, user, channel, P)
    attempt = None
    if seq is not None:
        attempt = Attempt(delivery_id=did, seq=seq, channel=channel, provider=kw.get("provider", "twilio"),
                          started_at=at - 0.1, result=kw.pop("result", "ACCEPTED"), latency_ms=12.0)
    return Outcome(delivery_id=did, notification_id=ids.notification_id(biz_key, user, P), biz_key=biz_key, producer=P,
                   user_id=user, channel=channel, category="transaction", template="order_shipped",
                   priority="normal", state=state, at=at, attempt=attempt, accepted_at=at - 1, **kw)


def entries(url, topic):
    r = redis.Redis.from_url(url)
    keys = Keys()
    out = [(p, f) for p in range(PARTITIONS) for _e, f in r.xrange(keys.stream(topic, p))]
    r.close()
    return out


def partition_of(key: bytes) -> int:
    return DefaultPartitioner()(key, list(range(PARTITIONS)), list(range(PARTITIONS)))


async def test_notification_by_id_with_attempts(api):
    now = time.time()
    store = await RecordStore(str(api.store_path)).open()
    await store.apply_outcomes([
        outcome("o:1", "u1", "sms", "PENDING", now - 3),
        outcome("o:1", "u1", "sms", "PENDING", now - 2, seq=1, result="TRANSIENT_ERROR", reason="transient_error"),
        outcome("o:1", "u1", "sms", "ACCEPTED", now - 1, seq=2, provider="twilio", provider_msg_id="SM1"),
        outcome("o:1", "u1", "push", "FILTERED", now - 1, reason="unreachable"),
    ])
    await store.close()
    nid = ids.notification_id("o:1", "u1", P)

    status, body = await api.call("GET", f"/v1/notifications/{nid}", "reader")
    assert status == 200, body
    assert body["notification_id"] == nid and body["biz_key"] == "o:1" and body["user_id"] == "u1"
    by_channel = {d["channel"]: d for d in body["deliveries"]}
    sms = by_channel["sms"]
    # ACCEPTED stays ACCEPTED: no receipt, no DELIVERED
    assert sms["state"] == "ACCEPTED" and sms["provider_msg_id"] == "SM1" and sms["delivered_at"] is None
    assert [a["result"] for a in sms["attempts"]] == ["TRANSIENT_ERROR", "ACCEPTED"]
    assert by_channel["push"]["state"] == "FILTERED" and by_channel["push"]["reason"] == "unreachable"
    assert body["state"] == "ACCEPTED"

    status, body = await api.call("GET", f"/v1/notifications/{nid}.sms", "reader")
    assert status == 200 and [d["channel"] for d in body["deliveries"]] == ["sms"]
    assert len(body["deliveries"][0]["attempts"]) == 2

    for bad in ("n_" + "f" * 20, "nope", f"{nid}.pigeon"):
        status, body = await api.call("GET", f"/v1/notifications/{bad}", "reader")
        assert status == 404 and body["error"]["code"] == "not_found"


async def test_list_paginated(api):
    now = time.time()
    store = await RecordStore(str(api.store_path)).open()
    await store.apply_outcomes([outcome(f"p:{i}", "u7", "inbox", "DELIVERED", now + i) for i in range(5)]
                               + [outcome("p:0", "u8", "inbox", "PENDING", now)])
    await store.close()
    seen, cursor = [], None
    while True:
        q = "/v1/notifications?user_id=u7&limit=2" + (f"&cursor={cursor}" if cursor else "")
        status, body = await api.call("GET", q, "reader")
        assert status == 200, body
        seen += [r["biz_key"] for r in body["items"]]
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert seen == [f"p:{i}" for i in reversed(range(5))]
    status, body = await api.call("GET", "/v1/notifications?biz_key=p:0", "reader")
    assert sorted(r["user_id"] for r in body["items"]) == ["u7", "u8"]
    status, body = await api.call("GET", "/v1/notifications?biz_key=p:0&user_id=u8", "reader")
    assert [r["state"] for r in body["items"]] == ["PENDING"]
    for q, field in (("limit=0", "limit"), ("limit=abc", "limit"), ("cursor=-1", "cursor")):
        status, body = await api.call("GET", f"/v1/notifications?{q}", "reader")
        assert status == 400 and body["error"]["field"] == field


async def test_preferences_put_get_versions(api):
    status, body = await api.call("GET", "/v1/users/u5/preferences", "reader")
    assert status == 404
    prefs = {"switches": {"marketing.sms": False}, "quiet_hours": "22:00-07:00", "tz": "Asia/Shanghai"}
    status, body = await api.call("PUT", "/v1/users/u5/preferences", "users", json=prefs)
    assert status == 202, body
    assert body["version"] == 1 and body["user_id"] == "u5"
    status, body = await api.call("PUT", "/v1/users/u5/preferences", "users", json={**prefs, "tz": "UTC"})
    assert status == 202 and body["version"] == 2
    status, got = await api.call("GET", "/v1/users/u5/preferences", "reader")
    assert status == 200 and got["tz"] == "UTC" and got["version"] == 2 and got["switches"] == {"marketing.sms": False}
    # a lower explicit version is refused (the pipeline would ignore it)
    status, body = await api.call("PUT", "/v1/users/u5/preferences", "users", json={**prefs, "version": 1})
    assert status == 409 and body["error"]["code"] == "stale_version"
    # validation errors name the field
    for bad, code, field in (({"tz": "Mars/Base"}, "bad_timezone", "tz"),
                             ({"quiet_hours": "25:00-07:00"}, "bad_quiet_hours", "quiet_hours"),
                             ({"switches": {"nope.sms": False}}, "unknown_category", "switches.nope.sms"),
                             ({"user_id": "other"}, "bad_value", "user_id")):
        status, body = await api.call("PUT", "/v1/users/u5/preferences", "users", json=bad)
        assert status == 400 and body["error"]["code"] == code and body["error"]["field"] == field, body
    # both accepted updates are on notify.preferences, keyed and partitioned by user
    written = entries(api.redis_url, "notify.preferences")
    assert [orjson.loads(f[b"v"])["version"] for _p, f in written] == [1, 2]
    assert {p for p, _f in written} == {partition_of(b"u5")} and written[0][1][b"k"] == b"u5"


async def test_devices(api):
    status, body = await api.call("PUT", "/v1/users/u6/devices/abc123", "users", json={"platform": "fcm"})
    assert status == 202 and body["op"] == "add"
    status, body = await api.call("DELETE", "/v1/users/u6/devices/abc123", "users")
    assert status == 202 and body["op"] == "remove"
    for kw in ({"json": {"platform": "sms"}}, {"json": {}}, {"json": [1]}):
        status, body = await api.call("PUT", "/v1/users/u6/devices/abc123", "users", **kw)
        assert status == 400, body
    status, body = await api.call("PUT", "/v1/users/u6/devices/bad%20token", "users", json={"platform": "fcm"})
    assert status == 400 and body["error"]["field"] == "token"
    written = entries(api.redis_url, "notify.devices")
    vals = [orjson.loads(f[b"v"]) for _p, f in written]
    assert [(v["op"], v["token"], v["platform"]) for v in vals] == [("add", "abc123", "fcm"), ("remove", "abc123", "apns")]
    assert {p for p, _f in written} == {partition_of(b"u6")}


async def test_a_huawei_device_registers_with_platform_hms(api):
    status, body = await api.call("PUT", "/v1/users/u7/devices/IQAAAACy0kYk", "users", json={"platform": "hms"})
    assert (status, body["platform"]) == (202, "hms")
    status, body = await api.call("DELETE", "/v1/users/u7/devices/IQAAAACy0kYk?platform=hms", "users")
    assert (status, body["platform"], body["op"]) == (202, "hms", "remove")
    status, body = await api.call("PUT", "/v1/users/u7/devices/IQAAAACy0kYk", "users", json={"platform": "mipush"})
    assert status == 400 and "hms" in body["error"]["message"], body


async def test_inbox_and_unread(api):
    store = await RecordStore(str(api.store_path)).open()
    await store.add_inbox([InboxItem("u9", ids.delivery_id(f"i:{i}", "u9", "inbox"), f"t{i}", f"b{i}",
                                     created_at=100.0 + i) for i in range(3)])
    await store.close()
    status, body = await api.call("GET", "/v1/users/u9/inbox", "reader")
    assert status == 200 and body["unread"] == 3 and [i["title"] for i in body["items"]] == ["t2", "t1", "t0"]
    status, page = await api.call("GET", "/v1/users/u9/inbox?limit=2", "reader")
    assert len(page["items"]) == 2 and page["next_before"] is not None
    status, rest = await api.call("GET", f"/v1/users/u9/inbox?limit=2&before={page['next_before']}", "reader")
    assert [i["title"] for i in rest["items"]] == ["t0"] and rest["next_before"] is None
    status, body = await api.call("POST", "/v1/users/u9/inbox/read", "users",
                                  json={"delivery_ids": [ids.delivery_id("i:0", "u9", "inbox")]})
    assert status == 200 and body == {"user_id": "u9", "marked": 1, "unread": 2}
    status, body = await api.call("POST", "/v1/users/u9/inbox/read", "users", json={"all": True})
    assert status == 200 and body["marked"] == 2 and body["unread"] == 0
    status, body = await api.call("POST", "/v1/users/u9/inbox/read", "users", json={})
    assert status == 400 and body["error"]["field"] == "delivery_ids"


async def test_preferences_concurrent_puts_get_distinct_versions(api):
    import asyncio

    results = await asyncio.gather(*[api.call("PUT", "/v1/users/c1/preferences", "users",
                                              json={"switches": {"marketing.*": i % 2 == 0}}) for i in range(6)])
    assert all(s == 202 for s, _ in results), results
    assert sorted(b["version"] for _s, b in results) == [1, 2, 3, 4, 5, 6]
    status, got = await api.call("GET", "/v1/users/c1/preferences", "reader")
    assert got["version"] == 6
    written = [orjson.loads(f[b"v"])["version"] for _p, f in entries(api.redis_url, "notify.preferences")]
    assert sorted(written) == [1, 2, 3, 4, 5, 6]


async def test_preferences_failed_write_restores_read_model(api, monkeypatch):
    from pipeline.api.app import API_KEY

    status, _ = await api.call("PUT", "/v1/users/c2/preferences", "users", json={"tz": "UTC"})
    assert status == 202
    writer = api.app[API_KEY].writer

    async def broken(messages):
        raise ConnectionError("broker gone")

    monkeypatch.setattr(writer, "send", broken)
    status, body = await api.call("PUT", "/v1/users/c2/preferences", "users", json={"tz": "Asia/Tokyo"})
    assert status == 503 and body["error"]["code"] == "broker_unavailable"
    status, got = await api.call("GET", "/v1/users/c2/preferences", "reader")
    assert got["tz"] == "UTC" and got["version"] == 1  # what the pipeline has, not the failed update
    status, body = await api.call("PUT", "/v1/users/c3/preferences", "users", json={"tz": "UTC"})
    assert status == 503
    status, _ = await api.call("GET", "/v1/users/c3/preferences", "reader")
    assert status == 404
