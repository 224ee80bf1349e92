"""`notify user set` returns once every consumer group meant to run has applied what
it wrote, a group whose worker is restarting (no slot held for a moment) included,
and says so when one has not (the simulator-families test: the priority worker
restarting with the SMS simulators held no slot, `user set` did not wait for it,
and the OTP sent next ended FILTERED ``unreachable``)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time

import orjson

from pipeline.cli.send import _wait_applied, meant_to_run, send_raw
from pipeline.transport import committed
from pipeline.transport.keys import Keys
from tests.cli.test_cli import ROOT
from tests.cli.test_cluster_cli import base_env

MAIN, PRIORITY = "notify", "notify-priority"


def _restarting(r, keys: Keys, group: str, name: str) -> None:
    r.hset(keys.supervisor, f"h/{name}", orjson.dumps({"pid": None, "up": False, "restart_at": time.time(),
                                                       "group": group}))


def test_the_groups_meant_to_run(redis_url, redis_sync):
    keys = Keys("mr1")
    assert meant_to_run(redis_sync, keys) == []
    redis_sync.set(keys.lease(MAIN, 0), b"m1")
    assert meant_to_run(redis_sync, keys) == [MAIN]
    redis_sync.hset(keys.supervisor, "h/priority", orjson.dumps({"up": False, "restart_at": None,
                                                                 "group": PRIORITY}))
    assert meant_to_run(redis_sync, keys) == [MAIN]  # stopped for good: not waited for
    _restarting(redis_sync, keys, PRIORITY, "priority")
    assert meant_to_run(redis_sync, keys) == [MAIN, PRIORITY]
    redis_sync.hset(keys.supervisor, "h/x", b"\xff not json")
    assert meant_to_run(redis_sync, keys) == [MAIN, PRIORITY]


def _commit_past(r, keys: Keys, group: str, written: list) -> None:
    for m in written:
        r.hset(keys.commits(group, m.partition), keys.tp_field(m.topic, m.partition), m.offset + 1)


def test_user_set_waits_for_a_restarting_group_and_says_when_one_never_applied(redis_url, redis_sync, tmp_path):
    keys = Keys("us1")
    env = dict(base_env(tmp_path), REDIS_URL=redis_url + "?prefix=us1", NOTIFY_PARTITIONS="2")
    redis_sync.set(keys.lease(MAIN, 0), b"m1")
    _restarting(redis_sync, keys, PRIORITY, "priority")

    def apply_later() -> None:  # the main group at once, the priority group's new worker 1.5 s later
        deadline = time.time() + 20
        while time.time() < deadline and not sum(redis_sync.xlen(keys.stream("notify.preferences", p))
                                                  for p in range(2)):
            time.sleep(0.02)
        tps = [(t, p) for t in ("notify.preferences",) for p in range(2)]
        ends = [int(redis_sync.get(keys.counter(t, p)) or 0) for t, p in tps]
        for (t, p), end in zip(tps, ends):
            redis_sync.hset(keys.commits(MAIN, p), keys.tp_field(t, p), end)
        time.sleep(1.5)
        for (t, p), end in zip(tps, ends):
            redis_sync.hset(keys.commits(PRIORITY, p), keys.tp_field(t, p), end)

    feeder = threading.Thread(target=apply_later)
    feeder.start()
    t0 = time.time()
    p = subprocess.run([sys.executable, "-m", "pipeline.cli", "user", "set", "ws1", "--phone", "+15550001234"],
                       cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=60)
    took = time.time() - t0
    feeder.join()
    assert p.returncode == 0 and orjson.loads(p.stdout)["user"] == "ws1", p.stderr
    assert took >= 1.5 and "not applied" not in p.stderr, (took, p.stderr)
    assert all((committed.read_sync(redis_sync, keys, PRIORITY, [("notify.preferences", q)])[0] or 0) > 0
               or not redis_sync.xlen(keys.stream("notify.preferences", q)) for q in range(2))

    # a group that never applies: the wait ends at its timeout and names it
    url = redis_url + "?prefix=us1"
    written = asyncio.run(send_raw(url, "notify.preferences", [(b"ws2", orjson.dumps({"user_id": "ws2"}))]))
    _commit_past(redis_sync, keys, MAIN, written)
    assert _wait_applied(url, written, timeout=0.3) == [PRIORITY]
    _commit_past(redis_sync, keys, PRIORITY, written)
    assert _wait_applied(url, written, timeout=0.3) == []
