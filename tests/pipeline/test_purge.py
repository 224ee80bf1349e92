"""Table hygiene: lane inflight marks of finished deliveries are purged (a
tombstone on the changelog), so the table does not grow without bound."""

import redis

from pipeline.ids import delivery_id
from pipeline.transport.groups import entry_changes
from tests.transport.helpers import wait_until

from .harness import PARTITIONS, Pipeline


def tombstoned(r: redis.Redis, dids: set[bytes]) -> bool:
    """Every delivery id in ``dids`` has inflight changelog entries, and on each
    partition that holds it the last one is a tombstone (no value)."""
    last: dict = {}  # key -> {partition: its last change has a value}
    for p in range(PARTITIONS):
        for _id, f in r.xrange(f"nfs:{{notify-inflight-changelog|{p}}}:s"):
            for k, v in entry_changes(f):  # an entry, or each change a group entry lists
                last.setdefault(k.encode(), {})[p] = v is not None
    return all(k in last and not any(last[k].values()) for k in dids)


def test_inflight_marks_of_done_deliveries_are_purged(redis_url, tmp_path):
    pipe = Pipeline(redis_url, tmp_path, NOTIFY_PURGE_EVERY_S="1", NOTIFY_INFLIGHT_KEEP_S="0")
    try:
        pipe.preferences([{"user_id": "pg1", "phone": "+15550001234", "version": 1}])
        pipe.start()
        pipe.events([{"biz_key": "purge:1", "category": "otp", "template": "otp", "channels": ["sms"],
                      "recipients": ["pg1"], "params": {"code": "1"}}])
        pipe.wait_rows(lambda r: r.get(("purge:1", "pg1", "sms"), {}).get("status") == "ACCEPTED", 60, "accepted")
        r = redis.Redis.from_url(redis_url)
        did = delivery_id("purge:1", "pg1", "sms").encode()
        wait_until(lambda: tombstoned(r, {did}), 30, 0.3, "an inflight tombstone")
    finally:
        pipe.stop()


def test_purge_in_chunks_tombstones_every_expired_mark(redis_url, tmp_path):
    """A purge larger than its chunk (NOTIFY_PURGE_CHUNK=7) waits between chunks
    and still deletes every expired mark, on the right partition."""
    n = 40
    pipe = Pipeline(redis_url, tmp_path, NOTIFY_PURGE_EVERY_S="2", NOTIFY_INFLIGHT_KEEP_S="0",
                    NOTIFY_PURGE_CHUNK="7")
    try:
        users = [f"pc{i}" for i in range(n)]
        pipe.preferences([{"user_id": u, "phone": f"+1555002{i + 100:04d}", "version": 1} for i, u in enumerate(users)])
        pipe.start()
        pipe.events([{"biz_key": f"chunk:{i}", "category": "otp", "template": "otp", "channels": ["sms"],
                      "recipients": [u], "params": {"code": "1"}} for i, u in enumerate(users)])
        pipe.wait_rows(lambda rows: sum(1 for (b, _u, _c), row in rows.items()
                                        if b.startswith("chunk:") and row.get("status") == "ACCEPTED") == n,
                       60, "all accepted")
        r = redis.Redis.from_url(redis_url)
        dids = {delivery_id(f"chunk:{i}", u, "sms").encode() for i, u in enumerate(users)}
        wait_until(lambda: tombstoned(r, dids), 30, 0.3, "a tombstone for every mark")
    finally:
        pipe.stop()
