"""The scheduler fires every due timer exactly once and never early (issue 24,
item 10), against a real worker on a real server: timers held as the pipeline
holds them (deferred intents, delivery retries, written to notify.timers keyed by
their user; receipts waiting for their record), some already due, most due over
the next seconds, a few held again for later; then a restart, after which
nothing fires twice and what comes due after it fires once.

The payloads are of priority ``high``, whose topics a ``main`` worker (which runs
the scheduler) does not read: what the scheduler wrote back stays in them to be
counted."""

import re
import time

import orjson
import redis

from bench.scheduler import timer
from tests.pipeline.harness import Pipeline
from tests.transport.helpers import wait_until

BIZ = re.compile(rb'"biz_key":"sched:(\d+)"')
DEST = ("notify.intents.high", "notify.send.sms.high")


def fired(url: str, partitions: int) -> list[tuple[int, float]]:
    """(item, time its payload was written) of every entry the scheduler wrote back."""
    r = redis.Redis.from_url(url)
    try:
        out = []
        for topic in DEST:
            for p in range(partitions):
                for _eid, f in r.xrange(f"nfs:{{{topic}|{p}}}:s"):
                    m = BIZ.search(f.get(b"v", b""))
                    assert m, f
                    out.append((int(m.group(1)), float(f[b"t"])))
        return out
    finally:
        r.close()


def unmatched(url: str, partitions: int) -> list[tuple[str, float]]:
    """(message id, time) of the receipts the scheduler gave up on (dead letters)."""
    r = redis.Redis.from_url(url)
    try:
        out = []
        for p in range(partitions):
            for _eid, f in r.xrange(f"nfs:{{notify.dlq|{p}}}:s"):
                d = orjson.loads(f[b"v"])
                if d["source"] == "receipts" and d["reason"] == "unmatched_receipt":
                    out.append((orjson.loads(d["payload"])["provider_msg_id"], float(f[b"t"])))
        return out
    finally:
        r.close()


def test_every_due_timer_fires_once_and_never_early(redis_url, tmp_path):
    pipe = Pipeline(redis_url, tmp_path, NOTIFY_ROLE="main", NOTIFY_MAIN_SCHED="normal", NOTIFY_MAIN_NICE="0",
                    NOTIFY_SCHEDULER_BATCH="200")  # several passes for what is due at once
    n = 3000
    try:
        pipe.start("worker")
        # holds read before the start's seek are read again after it (a replay, absorbed
        # downstream), and a timer already fired would fire a second time
        wait_until(lambda: pipe.settled("worker"), 60, 0.1, "the worker ready after its seek")
        now = time.time()
        due: dict[int, float] = {}
        items = []
        # a few held twice (the second hold, read long before either time, wins:
        # sooner or later than the first, the timer fires once, at the second's time)
        again = {i: now + (5 if i % 2 else 8) for i in range(1, 60, 3)}
        for i in range(n):
            if i in again:
                due[i] = now + 7
            elif i % 3 == 0:
                due[i] = now - 30 + i / n  # already due when held: fired at once
            else:
                due[i] = now + 2 + 3 * i / n  # due over the next seconds
            key, t = timer(i, due[i], "high", "intent" if i % 2 else "delivery")
            items.append((key, orjson.dumps(t)))
        for i, d in again.items():
            due[i] = d
            key, t = timer(i, d, "high", "intent" if i % 2 else "delivery")
            items.append((key, orjson.dumps(t)))
        # receipts waiting for their record, on their last try: their work (a record
        # lookup, then a dead letter unmatched_receipt) runs beside the passes
        receipts = {f"SMsched{j}": now + 3 + j / 10 for j in range(20)}
        for msg, d in receipts.items():
            r = {"provider": "twilio", "provider_msg_id": msg, "status": "DELIVERED", "at": now}
            items.append((msg.encode(), orjson.dumps({"timer_id": f"receipt:twilio:{msg}:4", "due_at": d,
                                                      "kind": "receipt",
                                                      "payload": {"receipt": r, "tries": 5, "user_id": msg}})))
        pipe.send("notify.timers", items)
        wait_until(lambda: len(fired(redis_url, pipe.partitions)) >= n, 60, 0.2, "every timer fired")
        wait_until(lambda: len(unmatched(redis_url, pipe.partitions)) >= len(receipts), 30, 0.2, "receipts fired")
        time.sleep(1.5)
        letters = unmatched(redis_url, pipe.partitions)
        assert sorted(k for k, _t in letters) == sorted(receipts)  # each once
        assert [(k, t) for k, t in letters if t < receipts[k]] == []  # none early
        got = fired(redis_url, pipe.partitions)
        counts: dict[int, int] = {}
        for i, t in got:
            counts[i] = counts.get(i, 0) + 1
        assert sorted(counts) == list(range(n))
        assert [i for i, c in counts.items() if c > 1] == []
        early = [(i, t, due[i]) for i, t in got if t < due[i]]
        assert early == []
        # on time: what came due once held fired within a second of its time
        late = sorted(t - due[i] for i, t in got if due[i] > now + 1)
        assert late[int(0.99 * (len(late) - 1))] < 1.0, late[-10:]

        # held now, due after a restart: fired once by the restarted worker; and
        # nothing fired before the restart fires again after it
        after = time.time() + 6
        extra = {n + j: after + j / 100 for j in range(100)}
        pipe.send("notify.timers", [(timer(i, d, "high", "delivery")[0], orjson.dumps(timer(i, d, "high", "delivery")[1]))
                                    for i, d in extra.items()])
        pipe.wait_committed({"notify.timers": len(items) + len(extra)})
        assert len(unmatched(redis_url, pipe.partitions)) == len(receipts)
        pipe.stop()
        pipe.procs.clear()
        pipe.start("worker2")
        wait_until(lambda: len(fired(redis_url, pipe.partitions)) >= n + len(extra), 60, 0.2, "the later timers fired")
        time.sleep(2)
        got = fired(redis_url, pipe.partitions)
        counts = {}
        for i, t in got:
            counts[i] = counts.get(i, 0) + 1
        assert sorted(counts) == list(range(n + len(extra)))
        assert [i for i, c in counts.items() if c > 1] == []
        assert [(i, t) for i, t in got if i in extra and t < extra[i]] == []
        assert len(unmatched(redis_url, pipe.partitions)) == len(receipts)
    finally:
        pipe.stop()
