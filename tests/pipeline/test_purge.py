"""Table hygiene: lane inflight marks of finished deliveries are purged (a
tombstone on the changelog), so the table does not grow without bound."""

import redis

from pipeline.ids import delivery_id
from tests.transport.helpers import wait_until

from .harness import PARTITIONS, Pipeline


def test_inflight_marks_of_done_deliveries_are_purged(redis_url, tmp_path):
    pipe = Pipeline(redis_url, tmp_path, NOTIFY_PURGE_EVERY_S="1", NOTIFY_INFLIGHT_KEEP_S="0")
    try:
        pipe.preferences([{"user_id": "pg1", "phone": "+15550001234", "version": 1}])
        pipe.start()
        pipe.events([{"biz_key": "purge:1", "category": "otp", "template": "otp", "channels": ["sms"],
                      "recipients": ["pg1"], "params": {"code": "1"}}])
        pipe.wait_rows(lambda r: r.get(("purge:1", "pg1", "sms"), {}).get("status") == "ACCEPTED", 60, "accepted")
        did = delivery_id("purge:1", "pg1", "sms").encode()
        r = redis.Redis.from_url(redis_url)

        def tombstoned():
            for p in range(PARTITIONS):
                entries = [f for _id, f in r.xrange(f"nfs:{{notify-inflight-changelog|{p}}}:s")]
                mine = [f for f in entries if f.get(b"k", b"").strip(b'"') == did]
                if mine and b"v" not in mine[-1]:
                    return True
            return False

        wait_until(tombstoned, 30, 0.3, "an inflight tombstone")
    finally:
        pipe.stop()
