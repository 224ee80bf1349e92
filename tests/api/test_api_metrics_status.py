"""/metrics (the pipeline registry + lag read from Redis at scrape time) and
the status page with /v1/status.json."""

from __future__ import annotations

import asyncio
import time

import orjson
import redis
from aiokafka.partitioner import DefaultPartitioner
from prometheus_client.parser import text_string_to_metric_families

from pipeline import metrics as pm  # noqa: F401  (the worker metrics, registered in this process as in a worker)
from pipeline.models import DeadLetter, Outcome
from pipeline import ids
from pipeline.store import RecordStore
from pipeline.transport.keys import Keys
from pipeline.transport.scripts import PRODUCE

PARTITIONS = 4
KEYS = Keys()


def produce(url: str, topic: str, partition: int, values: list[bytes], ts: float) -> int:
    """Append like the transport does (Lua PRODUCE), with a chosen timestamp."""
    r = redis.Redis.from_url(url)
    args: list = ["", len(values)]
    for v in values:
        args += [repr(ts), 3, b"k", v, 0]
    base = r.eval(PRODUCE, 3, KEYS.stream(topic, partition), KEYS.counter(topic, partition),
                  KEYS.fence(topic, partition), *args)
    r.close()
    return int(base)


def commit(url: str, topic: str, partition: int, offset: int, group: str = "notify") -> None:
    r = redis.Redis.from_url(url)
    r.hset(KEYS.offsets(group), KEYS.tp_field(topic, partition), offset)
    r.close()


async def scrape(api) -> dict[tuple[str, tuple], float]:
    async with api.http.get(api.url + "/metrics") as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = await resp.text()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def lag_of(m, metric, topic, p, agent):
    return m.get((metric, (("agent", agent), ("group", "notify"), ("partition", str(p)), ("topic", topic))))


async def test_metrics_present_and_lag_moves(api):
    m = await scrape(api)
    names = {name for name, _l in m}
    # the pipeline's own registry, the API's counters and the lag gauges
    assert {"notify_events_in_total", "notify_lag_up", "notify_consumer_lag",
            "notify_consumer_lag_seconds", "notify_topic_highwater", "notify_dead_letter_depth",
            "notify_scheduled_backlog_messages", "notify_records_scheduled"} <= names
    assert m[("notify_lag_up", ())] == 1.0
    assert lag_of(m, "notify_consumer_lag", "notify.events", 0, "expand") == 0
    assert lag_of(m, "notify_consumer_lag", "notify.send.sms.high", 3, "lane.sms.high") == 0

    # three messages on a lane, written 50 s ago, nothing committed: lag 3, age ≥ 50 s
    produce(api.redis_url, "notify.send.sms.high", 2, [b"a", b"b", b"c"], time.time() - 50)
    m = await scrape(api)
    assert lag_of(m, "notify_consumer_lag", "notify.send.sms.high", 2, "lane.sms.high") == 3
    assert lag_of(m, "notify_consumer_lag_seconds", "notify.send.sms.high", 2, "lane.sms.high") >= 50
    assert m[("notify_topic_highwater", (("partition", "2"), ("topic", "notify.send.sms.high")))] == 3

    # the agent commits two: lag 1, and the age is now the third message's
    produce(api.redis_url, "notify.send.sms.high", 2, [b"d"], time.time())
    commit(api.redis_url, "notify.send.sms.high", 2, 2)
    await asyncio.sleep(0.3)  # past the sampler's min interval
    m = await scrape(api)
    assert lag_of(m, "notify_consumer_lag", "notify.send.sms.high", 2, "lane.sms.high") == 2
    assert lag_of(m, "notify_consumer_committed", "notify.send.sms.high", 2, "lane.sms.high") == 2
    assert lag_of(m, "notify_consumer_lag_seconds", "notify.send.sms.high", 2, "lane.sms.high") >= 50
    assert m[("notify_consumer_rate", (("agent", "lane.sms.high"), ("group", "notify"),
                                       ("topic", "notify.send.sms.high")))] > 0
    commit(api.redis_url, "notify.send.sms.high", 2, 3)
    await asyncio.sleep(0.3)
    m = await scrape(api)
    assert lag_of(m, "notify_consumer_lag", "notify.send.sms.high", 2, "lane.sms.high") == 1
    assert lag_of(m, "notify_consumer_lag_seconds", "notify.send.sms.high", 2, "lane.sms.high") < 5

    # an event accepted by the API shows up as expand's lag on its partition (an OTP:
    # on notify.events.high, read by expand.high)
    status, _ = await api.call("POST", "/v1/events", "events", json={
        "biz_key": "m:1", "category": "otp", "template": "otp", "recipients": ["u1"], "params": {"code": "1"}})
    assert status == 202
    # one recipient: keyed by the user (pipeline/topics.py event_key)
    p = DefaultPartitioner()(b"u1", list(range(PARTITIONS)), list(range(PARTITIONS)))
    await asyncio.sleep(0.3)
    m = await scrape(api)
    assert lag_of(m, "notify_consumer_lag", "notify.events.high", p, "expand.high") == 1
    # ... and is gone once the priority worker's own group (pipeline/roles.py) committed it
    commit(api.redis_url, "notify.events.high", p, 1, group="notify-priority")
    await asyncio.sleep(0.3)
    m = await scrape(api)
    assert lag_of(m, "notify_consumer_lag", "notify.events.high", p, "expand.high") == 0
    assert m[("notify_api_events_accepted_total", ())] >= 1
    assert m[("notify_api_requests_total", (("method", "POST"), ("route", "/v1/events"), ("status", "202")))] >= 1

    # dead letters: the depth of notify.dlq
    dl = DeadLetter(source="expand", reason="unknown_category", at=time.time(), payload="{}").dumps()
    produce(api.redis_url, "notify.dlq", 1, [dl, dl], time.time())
    await asyncio.sleep(0.3)
    m = await scrape(api)
    assert m[("notify_dead_letter_depth", ())] == 2


async def test_metrics_when_redis_is_unreadable(api, monkeypatch):
    from pipeline.api.app import API_KEY

    sampler = api.app[API_KEY].sampler

    async def broken(now):
        raise ConnectionError("down")

    monkeypatch.setattr(sampler, "_take", broken)
    sampler.last = None
    m = await scrape(api)  # still 200, with lag_up 0 and no stale lag
    assert m[("notify_lag_up", ())] == 0.0
    assert not any(name == "notify_consumer_lag" for name, _l in m)


async def test_status_page_and_json(api):
    async with api.http.get(api.url + "/") as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/html")
        html = await resp.text()
    assert "/v1/status.json" in html and "setInterval(refresh, 2000)" in html
    assert "innerHTML" not in html  # values are set as text, never parsed as markup

    now = time.time()
    store = await RecordStore(str(api.store_path)).open()
    rows = []
    for i, (state, reason) in enumerate([("DELIVERED", None), ("FILTERED", "opted_out"), ("FILTERED", "opted_out"),
                                         ("FAILED", "invalid_number")]):
        did = ids.delivery_id(f"s:{i}", "u1", "sms")
        rows.append(Outcome(delivery_id=did, notification_id=ids.notification_id(f"s:{i}", "u1"), biz_key=f"s:{i}",
                            user_id="u1", channel="sms", category="otp", template="otp", priority="high",
                            state=state, reason=reason, at=now))
    await store.apply_outcomes(rows)
    await store.close()
    for i in range(12):
        dl = DeadLetter(source="expand", reason="bad_json", at=now + i, payload="secret-payload",
                        detail=f"<b>{i}</b>", key=f"k{i}").dumps()
        produce(api.redis_url, "notify.dlq", i % PARTITIONS, [dl], now + i)
    produce(api.redis_url, "notify.send.push.low", 0, [b"x"] * 5, now - 10)
    # a worker's breaker board (pipeline/breakers.py): what the status page shows of every worker
    import redis.asyncio as aioredis

    from pipeline.breakers import BreakerBoard
    from pipeline.transport.keys import Keys

    client = aioredis.Redis.from_url(api.redis_url)

    async def get_client():
        return client

    board = BreakerBoard(get_client, Keys().breakers, worker="h1/main-0")
    board.note("sms_a", "open", since=now)
    board.note("twilio", "closed", since=now)
    await board._task
    await client.aclose()

    status, doc = await api.call("GET", "/v1/status.json", None)
    assert status == 200 and doc["broker"]["ok"] is True
    lanes = {t["topic"]: t for t in doc["lanes"]}
    assert len(lanes) == 15  # 5 channels × 3 priorities
    assert lanes["notify.send.push.low"]["lag"] == 5 and lanes["notify.send.push.low"]["oldest_age_s"] >= 10
    assert lanes["notify.send.push.low"]["agent"] == "lane.push.low"
    assert {t["topic"] for t in doc["topics"]} >= {"notify.events", "notify.timers"}
    assert "notify.outcomes" not in {t["topic"] for t in doc["topics"]}  # no agent reads it: no lag
    assert isinstance(doc["outcome_entries_published"], int)
    assert doc["today"]["states"] == {"FILTERED": 2, "FAILED": 1, "DELIVERED": 1}
    assert doc["today"]["reasons"]["FILTERED"] == {"opted_out": 2}
    assert doc["breakers"]["sms_a"] == {"h1/main-0": {"state": "open", "since": now}}
    assert doc["breakers"]["twilio"]["h1/main-0"]["state"] == "closed"
    assert doc["dlq_depth"] == 12
    dead = doc["dead_letters"]
    assert [d["key"] for d in dead] == [f"k{i}" for i in range(11, 1, -1)]  # newest 10
    assert all("payload" not in d for d in dead) and "secret-payload" not in orjson.dumps(doc).decode()


async def test_the_scaling_signal_follows_the_backlog(api):
    """A backlog on the high lanes older than the OTP goal (5 s) and not draining:
    one worker more is asked for; once it drains, one is enough (issue 20, item 7)."""
    m = await scrape(api)
    assert m[("notify_workers_needed", (("priority", "high"),))] == 1
    produce(api.redis_url, "notify.send.sms.high", 1, [b"x"] * 50, time.time() - 30)
    await asyncio.sleep(0.3)
    m = await scrape(api)
    assert m[("notify_priority_oldest_seconds", (("priority", "high"),))] >= 30
    assert m[("notify_workers_needed", (("priority", "high"),))] == 2
    status, doc = await api.call("GET", "/v1/status.json", None)
    high = next(x for x in doc["scaling"] if x["priority"] == "high")
    assert (high["lag"], high["workers_needed"], high["goal_s"]) == (50, 2, 5.0)
    commit(api.redis_url, "notify.send.sms.high", 1, 50)
    await asyncio.sleep(0.3)
    m = await scrape(api)
    assert m[("notify_workers_needed", (("priority", "high"),))] == 1
