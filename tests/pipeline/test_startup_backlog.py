"""Input written before the workers start is all applied and committed: two
workers, eight partitions, preferences and devices waiting in their topics.

(A worker that delivered fetched messages straight into the streams across its
first rebalance left some never acked: commits stuck at offset 1 and part of the
input never reached the tables. pipeline/transport/drain.py.)"""

import time

import redis

from pipeline.transport.groups import entry_changes

from tests.transport.helpers import wait_until

from .harness import Pipeline

N = 2000
PARTS = 8


def _changelog(r: redis.Redis, table: str) -> set:
    keys = set()
    for p in range(PARTS):
        for _id, f in r.xrange(f"nfs:{{notify-{table}-changelog|{p}}}:s"):
            keys.update(k for k, _v in entry_changes(f))  # an entry, or each change of a group entry
    return keys


def test_backlog_written_before_two_workers_start(redis_url, tmp_path):
    pipe = Pipeline(redis_url, tmp_path, partitions=PARTS, NOTIFY_WORKERS=2)
    r = redis.Redis.from_url(redis_url)
    try:
        pipe.preferences([{"user_id": f"sb{i}", "version": 1, "phone": f"+1555{i:06d}99"} for i in range(N)])
        pipe.devices([{"user_id": f"sb{i}", "token": f"tok{i:06d}99aaaaaaaaaaaaaaaa", "platform": "apns",
                       "op": "add", "at": time.time()} for i in range(0, N, 2)])
        pipe.start("w0", NOTIFY_WORKER_INDEX=0)
        pipe.start("w1", NOTIFY_WORKER_INDEX=1)
        pipe.wait_committed({"notify.preferences": N, "notify.devices": N // 2}, 90)
        wait_until(lambda: len(_changelog(r, "preferences")) == N and len(_changelog(r, "devices")) == N // 2,
                   30, 0.5, "a changelog entry for every user")
    finally:
        pipe.stop()
        r.close()
