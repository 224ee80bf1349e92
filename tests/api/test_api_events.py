"""POST /v1/events: accepted = in the stream, deterministic ids, idempotent
repeats, batches, validation errors with the field, size limits."""

from __future__ import annotations

import asyncio
import time

import orjson
import redis

from pipeline import ids
from pipeline.models import Outcome
from pipeline.store import RecordStore
from pipeline.transport.keys import Keys
from tests.api.conftest import BOOTSTRAP

from aiokafka.partitioner import DefaultPartitioner

#: the producer of the tests' keys (tests/api/conftest.py)
P = "test"

PARTITIONS = 4  # tests/api/conftest.py


def event(biz_key: str = "order_shipped:A1", to=("u1", "u2"), **kw):
    return {
        "biz_key": biz_key,
        "category": "transaction",
        "template": "order_shipped",
        "recipients": list(to),
        "params": {"order_no": "A1", "carrier": "UPS", "tracking_no": "1Z", "tracking_url": "https://x.test/1"},
        **kw,
    }


def stream_entries(url: str, topic: str) -> list[tuple[int, dict]]:
    r = redis.Redis.from_url(url)
    keys = Keys()
    out = []
    for p in range(PARTITIONS):
        for _eid, fields in r.xrange(keys.stream(topic, p)):
            out.append((p, fields))
    r.close()
    return out


async def test_event_is_in_the_stream_when_accepted(api):
    before = time.time()
    status, body = await api.call("POST", "/v1/events", "events", json=event())
    assert status == 202, body
    assert body["status"] == "accepted"
    assert [n["notification_id"] for n in body["notifications"]] == [
        ids.notification_id("order_shipped:A1", "u1", P), ids.notification_id("order_shipped:A1", "u2", P)
    ]
    entries = stream_entries(api.redis_url, "notify.events")
    assert len(entries) == 1
    p, fields = entries[0]
    # two recipients: keyed by the biz_key, the partition the Faust producer would pick (murmur2)
    assert p == DefaultPartitioner()(b"order_shipped:A1", list(range(PARTITIONS)), list(range(PARTITIONS)))
    assert fields[b"k"] == b"order_shipped:A1"
    assert fields[b"h:producer"] == b"test"
    value = orjson.loads(fields[b"v"])
    assert value["biz_key"] == "order_shipped:A1" and value["recipients"] == ["u1", "u2"]
    assert before <= value["accepted_at"] <= time.time()
    assert value["accepted_at"] == body["accepted_at"]
    assert float(fields[b"t"]) >= before
    # the topic is declared with the configured partition count
    r = redis.Redis.from_url(api.redis_url)
    assert int(r.hget("nfs:topics", "notify.events")) == PARTITIONS
    r.close()


async def test_high_priority_events_go_to_their_own_topic(api):
    """OTPs (category otp, priority high) are written to notify.events.high, so a
    campaign in notify.events never stands in front of them; an explicit priority
    decides over the category's up to the category's max_priority, above it only
    for a key with the priority:any scope (the bootstrap key has every scope;
    tests/security/test_door.py)."""
    otp = {"biz_key": "otp:1", "category": "otp", "template": "otp", "recipients": ["u1"], "params": {"code": "1"}}
    status, body = await api.call("POST", "/v1/events", "events", json=[
        otp, event("order_shipped:B1"), event("order_shipped:B2", priority="high")])
    assert status == 202, body
    assert [r["priority"] for r in body["results"]] == ["high", "normal", "normal"]  # B2: capped
    status, body = await api.call("POST", "/v1/events", BOOTSTRAP, json=event("order_shipped:B3", priority="high"))
    assert status == 202 and body["priority"] == "high", body
    high = sorted(orjson.loads(f[b"v"])["biz_key"] for _p, f in stream_entries(api.redis_url, "notify.events.high"))
    rest = sorted(orjson.loads(f[b"v"])["biz_key"] for _p, f in stream_entries(api.redis_url, "notify.events"))
    assert high == ["order_shipped:B3", "otp:1"]
    assert rest == ["order_shipped:B1", "order_shipped:B2"]


async def test_repeat_answers_original_ids_and_states_without_writing(api):
    status, first = await api.call("POST", "/v1/events", "events", json=event("promo:1"))
    assert status == 202
    # one of the two is recorded by the pipeline meanwhile
    store = await RecordStore(str(api.store_path)).open()
    nid = ids.notification_id("promo:1", "u1", P)
    await store.apply_outcomes([Outcome(
        delivery_id=ids.delivery_id("promo:1", "u1", "push", P), notification_id=nid, biz_key="promo:1", producer=P,
        user_id="u1", channel="push", category="transaction", template="order_shipped", priority="normal",
        state="ACCEPTED", at=time.time(), provider="apns", provider_msg_id="m1",
    )])
    await store.close()

    status, again = await api.call("POST", "/v1/events", "events", json=event("promo:1"))
    assert status == 200, again
    assert again["status"] == "duplicate"
    assert again["accepted_at"] == first["accepted_at"]
    by_user = {n["user_id"]: n for n in again["notifications"]}
    assert by_user["u1"]["notification_id"] == nid and by_user["u1"]["state"] == "ACCEPTED"
    assert by_user["u1"]["channels"][0]["channel"] == "push"
    assert by_user["u2"]["state"] == "PENDING" and by_user["u2"]["channels"] == []
    assert len(stream_entries(api.redis_url, "notify.events")) == 1  # not written twice

    # the same biz_key with other content: refused, nothing written
    status, conflict = await api.call("POST", "/v1/events", "events", json=event("promo:1", to=["u3"]))
    assert status == 409
    assert conflict["error"]["code"] == "biz_key_conflict" and conflict["error"]["field"] == "biz_key"
    assert len(stream_entries(api.redis_url, "notify.events")) == 1


async def test_concurrent_repeats_write_once(api):
    results = await asyncio.gather(*[api.call("POST", "/v1/events", "events", json=event("race:1"))
                                     for _ in range(8)])
    statuses = sorted(s for s, _ in results)
    assert statuses.count(202) == 1
    assert all(s in (200, 202, 409) for s in statuses)
    for s, body in results:
        if s == 409:
            assert body["error"]["code"] == "in_progress"
    assert len(stream_entries(api.redis_url, "notify.events")) == 1


async def test_batch_one_round_trip_mixed(api):
    await api.call("POST", "/v1/events", "events", json=event("b:0", to=["u0"]))
    batch = [event(f"b:{i}", to=[f"u{i}"]) for i in range(5)] + [event("b:1", to=["u1"])]
    status, body = await api.call("POST", "/v1/events", "events", json=batch)
    assert status == 202, body
    res = body["results"]
    assert [r["status"] for r in res] == ["duplicate", "accepted", "accepted", "accepted", "accepted", "duplicate"]
    assert res[1]["notifications"][0]["notification_id"] == ids.notification_id("b:1", "u1", P)
    assert res[5]["notifications"][0]["notification_id"] == ids.notification_id("b:1", "u1", P)
    entries = stream_entries(api.redis_url, "notify.events")
    # one recipient each: keyed by the user, where the user's tables are (topics.event_key)
    assert sorted(f[b"k"] for _p, f in entries) == [b"u0", b"u1", b"u2", b"u3", b"u4"]
    assert sorted(orjson.loads(f[b"v"])["biz_key"] for _p, f in entries) == [f"b:{i}" for i in range(5)]
    # the whole batch again: all repeats → 200
    status, body = await api.call("POST", "/v1/events", "events", json=batch[1:5])
    assert status == 200 and {r["status"] for r in body["results"]} == {"duplicate"}


async def test_validation_errors_name_the_field(api):
    cases = [
        ({**event(), "category": "nope"}, "unknown_category", "category"),
        ({**event(), "recipients": []}, "no_recipients", "recipients"),
        ({k: v for k, v in event().items() if k != "template"}, "missing_field", "template"),
        ({**event(), "channels": ["pigeon"]}, "unknown_channel", "channels"),
        ({**event(), "biz_key": "x" * 65}, "bad_value", "biz_key"),
        ({**event(), "priority": "urgent"}, "bad_priority", "priority"),
    ]
    for body, code, field in cases:
        status, resp = await api.call("POST", "/v1/events", "events", json=body)
        assert status == 400, (body, resp)
        assert resp["error"]["code"] == code and resp["error"]["field"] == field, resp
        assert resp["error"]["message"]
    status, resp = await api.call("POST", "/v1/events", "events", data=b"{not json",
                                  headers={"Content-Type": "application/json"})
    assert status == 400 and resp["error"]["code"] == "bad_json"
    # in a batch: the index is in the field, and nothing of the batch is written
    status, resp = await api.call("POST", "/v1/events", "events",
                                  json=[event("v:1"), {**event("v:2"), "recipients": "u1"}])
    assert status == 400 and resp["error"]["field"] == "[1].recipients" and resp["error"]["index"] == 1
    status, resp = await api.call("POST", "/v1/events", "events", json=[])
    assert status == 400 and resp["error"]["code"] == "empty_batch"
    assert stream_entries(api.redis_url, "notify.events") == []


async def test_oversized(api):
    big = event("big:1", params={"blob": "x" * 300_000})  # > max_event_bytes (256 KiB)
    status, resp = await api.call("POST", "/v1/events", "events", json=big)
    assert status == 413 and resp["error"]["code"] == "oversized"
    # one oversized event inside a batch
    status, resp = await api.call("POST", "/v1/events", "events", json=[event("big:2"), big])
    assert status == 413 and resp["error"]["field"] == "[1]"
    # more events than a batch may hold (the fixture's cap is 50)
    status, resp = await api.call("POST", "/v1/events", "events", json=[event(f"n:{i}") for i in range(51)])
    assert status == 413 and resp["error"]["code"] == "batch_too_large"
    # a body over client_max_size: aiohttp's 413, in our error shape
    status, resp = await api.call("POST", "/v1/events", "events", data=b"[" + b" " * (5 << 20) + b"]",
                                  headers={"Content-Type": "application/json"})
    assert status == 413 and resp["error"]["code"] == "too_large"
    assert stream_entries(api.redis_url, "notify.events") == []


async def test_failed_write_releases_the_claim(api, monkeypatch):
    from pipeline.api.app import API_KEY

    core = api.app[API_KEY]

    async def broken(messages):
        raise ConnectionError("broker gone")

    monkeypatch.setattr(core.writer, "send", broken)
    status, resp = await api.call("POST", "/v1/events", "events", json=event("retry:1"))
    assert status == 503 and resp["error"]["code"] == "broker_unavailable"
    monkeypatch.undo()
    # the producer's retry is accepted (not a phantom "duplicate" of nothing)
    status, resp = await api.call("POST", "/v1/events", "events", json=event("retry:1"))
    assert status == 202, resp
    assert len(stream_entries(api.redis_url, "notify.events")) == 1


async def test_params_a_template_needs_are_checked_at_the_door(api):
    """An event whose params lack a variable its template uses: 422 naming every missing
    variable, the template, channel and locale; nothing is written (issue 24, item 4)."""
    ev = {"biz_key": "tpl:1", "category": "transaction", "template": "order_shipped", "recipients": ["u1"],
          "channels": ["sms"], "params": {"order_no": "A1"}}
    status, body = await api.call("POST", "/v1/events", "events", json=ev)
    assert status == 422, body
    err = body["error"]
    assert err["code"] == "missing_params" and err["field"] == "params"
    assert "order_shipped/v1/sms.en.j2" in err["message"] and "(sms, default locale)" in err["message"]
    for name in ("carrier", "tracking_no"):
        assert name in err["message"]
    assert stream_entries(api.redis_url, "notify.events") == []
    ok = {**ev, "params": {"order_no": "A1", "carrier": "UPS", "tracking_no": "1Z", "tracking_url": "https://t"}}
    status, body = await api.call("POST", "/v1/events", "events", json=ok)
    assert status == 202, body
