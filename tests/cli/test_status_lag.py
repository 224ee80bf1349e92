"""Lag written once (pipeline/lag.py), read by `notify status` and the API's
/metrics alike; and every `notify` command in the key namespace of its broker URL
(``?prefix=``), never the default one (issue 22)."""

from __future__ import annotations

import json
import time

import orjson
import pytest

from pipeline import lag
from pipeline.topics import ALL
from pipeline.api.metrics_lag import LagSampler
from pipeline.transport.client import connect
from pipeline.transport.keys import Keys
from pipeline.transport.scripts import PRODUCE
from tests.cli.test_cli import notify
from tests.cli.test_cluster_cli import base_env

SMS_HIGH = "notify.send.sms.high"  # a priority topic: notify and notify-priority take turns on it


def produce(r, keys: Keys, topic: str, partition: int, n: int, ts: float, value: bytes = b"v") -> None:
    """``n`` entries appended as the transport appends them (Lua PRODUCE), stamped ``ts``."""
    args: list = ["", n]
    for _ in range(n):
        args += [repr(ts), 3, b"k", value, 0]
    r.eval(PRODUCE, 3, keys.stream(topic, partition), keys.counter(topic, partition), keys.fence(topic, partition),
           *args)


def status_rows(out: str) -> dict[str, list[str]]:
    return {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.startswith("notify.")}


async def test_positions_committed_ages_and_what_is_not_a_number(redis_url, redis_sync):
    keys = Keys("lagtest")
    produce(redis_sync, keys, SMS_HIGH, 1, 5, time.time() - 40)
    produce(redis_sync, keys, "notify.events", 0, 3, time.time())
    # the priority topic: as far as the furthest of the two groups
    redis_sync.hset(keys.offsets("notify"), keys.tp_field(SMS_HIGH, 1), 1)
    redis_sync.hset(keys.offsets("notify-priority"), keys.tp_field(SMS_HIGH, 1), 2)
    redis_sync.hset(keys.offsets("notify"), keys.tp_field("notify.events", 0), 3)
    redis_sync.set(keys.counter("notify.timers", 1), b"not a number")
    redis_sync.hset(keys.offsets("notify"), keys.tp_field("notify.intents", 0), b"?")
    redis_sync.hset(keys.topics, "notify.events", 2)  # declared with 2 partitions
    client = await connect([redis_url], attempts=1)
    try:
        counts = {t: 2 for t in (SMS_HIGH, "notify.events", "notify.timers", "notify.intents")}
        pos, also = await lag.read_positions(client, keys, counts, also=[("get", (keys.counter(SMS_HIGH, 1),))])
        assert also == [b"5"]
        assert lag.read_positions_sync(redis_sync, keys, counts) == (pos, [])  # `notify status`'s client
        assert pos.highwater[(SMS_HIGH, 1)] == 5 and pos.committed((SMS_HIGH, 1)) == 2
        assert pos.highwater[("notify.events", 1)] == 0 and pos.committed(("notify.events", 1)) == 0
        assert pos.highwater[("notify.timers", 1)] is None  # "?" in `notify status`
        assert pos.committed(("notify.intents", 0)) is None and pos.committed(("notify.intents", 0), bad=0) == 0
        ages = await lag.oldest_ages(client, keys, {(SMS_HIGH, 1): 2, ("notify.events", 0): 3})
        assert ages[(SMS_HIGH, 1)] >= 39 and ("notify.events", 0) not in ages  # nothing at offset 3 yet
        lags = await lag.read_lags(client, keys, partitions=4)
        assert list(lags) == list(ALL)
        sms = lags[SMS_HIGH]
        assert (sms.agent, len(sms.highwater), sms.lag) == ("lane.sms.high", 4, 3)
        assert max(sms.oldest_age) >= 39
        assert len(lags["notify.events"].highwater) == 2 and lags["notify.events"].lag == 0
        assert lags["notify.timers"].highwater == [0, 0, 0, 0]  # not a number: 0, as /metrics shows it
        # the API's sampler reads the same numbers
        snap = await LagSampler(client, keys, 4).snapshot()
        got = snap.topics[SMS_HIGH]
        assert snap.ok and (got.highwater, got.committed, got.lag) == (sms.highwater, sms.committed, sms.lag)
        assert got.oldest_age == pytest.approx(sms.oldest_age, abs=1.0)
    finally:
        await client.aclose()


def test_every_command_reads_and_writes_under_the_url_prefix(redis_url, redis_sync, tmp_path):
    """`notify status` (lag, slots, processes, breakers), `notify user set`, `notify
    outcomes tail` and `notify dlq ls` under ``?prefix=alt``; the same keys under the
    default prefix, with other numbers, are never read."""
    alt, default = Keys("alt"), Keys()
    env = dict(base_env(tmp_path), REDIS_URL=redis_url + "?prefix=alt", NOTIFY_PARTITIONS="2")
    out = json.loads(notify(env, "user", "set", "pu1", "--phone", "+15550001234").stdout)
    assert out["user"] == "pu1"
    assert sum(redis_sync.xlen(alt.stream("notify.preferences", p)) for p in range(2)) == 1
    assert not redis_sync.exists(*(default.stream("notify.preferences", p) for p in range(2)))
    for keys, n, owner in ((alt, 4, "w-alt"), (default, 9, "w-default")):
        produce(redis_sync, keys, SMS_HIGH, 1, n, time.time() - 30)
        redis_sync.hset(keys.offsets("notify"), keys.tp_field(SMS_HIGH, 1), 1)
        redis_sync.hset(keys.offsets("notify-priority"), keys.tp_field(SMS_HIGH, 1), 3)
        produce(redis_sync, keys, "notify.outcomes", 0, 1, time.time(), b'{"biz_key": "%s"}' % owner.encode())
        produce(redis_sync, keys, "notify.dlq", 0, 1, time.time(),
                orjson.dumps({"source": "expand", "reason": owner, "payload": "{}"}))
        redis_sync.set(keys.lease("notify", 0), owner)
        redis_sync.hset(keys.supervisor, f"h/{owner}", orjson.dumps({"pid": 1, "up": True, "restarts": 2}))
        redis_sync.hset(keys.breakers, f"h/{owner}/twilio", orjson.dumps({"state": "open", "since": 0}))
    redis_sync.set(alt.counter("notify.timers", 0), b"garbage")
    status = notify(env, "status").stdout
    rows = status_rows(status)
    assert rows[SMS_HIGH] == ["4", "3", "1"], status  # highwater, committed (the priority group's), lag
    assert rows["notify.outcomes"] == ["1", "-", "-"] and rows["notify.timers"][0] == "?", status
    assert "slots: 0→w-alt" in status and "h/w-alt" in status and "w-default" not in status, status
    assert any(line.split()[:3] == ["twilio", "h/w-alt", "open"] for line in status.splitlines()), status
    assert [json.loads(o)["biz_key"] for o in notify(env, "outcomes", "tail").stdout.splitlines()] == ["w-alt"]
    assert [json.loads(d)["reason"] for d in notify(env, "dlq", "ls").stdout.splitlines()] == ["w-alt"]


@pytest.mark.parametrize("prefix", [None, "alt"])
def test_broker_keys_follow_the_url(prefix):
    from pipeline.cli.broker import broker_keys

    url = "redis://127.0.0.1:6379/0" + (f"?prefix={prefix}" if prefix else "")
    assert broker_keys(url) == Keys(prefix or "nfs")
