"""Expand plans an intent itself when this worker runs the guard for its user
(agents/expand.py, agents/guard.py ``plans_here``): only intents for users held
by another worker go through notify.intents.<priority>."""

from aiokafka.partitioner import DefaultPartitioner

from pipeline.topics import event_key

from .harness import Pipeline

PARTS = 4


def test_event_key_is_the_one_recipient_else_the_business_key():
    assert event_key("otp:1", ["u1"]) == b"u1"
    assert event_key("ship:1", ["u1", "u2"]) == b"ship:1"
    assert event_key("ship:1", []) == b"ship:1"
    assert event_key("bad:1", "u1") == b"bad:1"  # not a list: expand dead-letters it, any key will do
    assert event_key("bad:2", [7]) == b"bad:2"


def test_intents_go_through_their_topic_only_to_another_worker(redis_url, tmp_path):
    pipe = Pipeline(redis_url, tmp_path, partitions=PARTS, NOTIFY_WORKERS=2)
    users = [{"user_id": f"x{i}", "phone": f"+1555030{i:04d}", "email": f"x{i}@example.com", "version": 1}
             for i in range(20, 36)]
    part = DefaultPartitioner()

    def worker_of(user: str) -> int:
        return part(user.encode(), list(range(PARTS)), list(range(PARTS))) % 2

    ship = {"category": "transaction", "template": "order_shipped", "channels": ["email"],
            "params": {"order_no": "o1", "carrier": "UPS", "tracking_no": "1Z", "tracking_url": "https://t.example/1Z"}}
    pairs = [(users[i]["user_id"], users[i + 1]["user_id"]) for i in range(0, len(users), 2)]
    pipe.preferences(users)
    pipe.start("w0", NOTIFY_WORKER_INDEX=0)
    pipe.start("w1", NOTIFY_WORKER_INDEX=1)
    try:
        pipe.events([{"biz_key": f"otp:{u['user_id']}", "category": "otp", "template": "otp", "channels": ["sms"],
                      "recipients": [u["user_id"]], "params": {"code": "123456"}} for u in users]
                    + [dict(ship, biz_key=f"ship:{a}:{b}", recipients=[a, b]) for a, b in pairs])
        n = 2 * len(users)
        rows = pipe.wait_rows(lambda r: len(r) >= n and all(v["status"] == "ACCEPTED" for v in r.values()), 90,
                              "every notification accepted")
    finally:
        pipe.stop()
    assert len(rows) == n
    # one recipient: keyed by the user, read and planned by the worker holding the user
    assert pipe.written("notify.intents.high") == 0
    # two recipients: the event is read by one worker, which plans its own users'
    # intents and writes the other worker's to the topic
    crossing = 0
    for a, b in pairs:
        reader = part(f"ship:{a}:{b}".encode(), list(range(PARTS)), list(range(PARTS))) % 2
        crossing += (worker_of(a) != reader) + (worker_of(b) != reader)
    assert 0 < crossing < len(users)  # both paths taken by this sample
    assert pipe.written("notify.intents.normal") == crossing
    assert sum(pipe.attempts().values()) == n  # each planned and sent once
    logs = pipe.log("w0") + pipe.log("w1")
    assert "Traceback" not in logs


def test_a_delivery_for_a_lane_of_the_same_worker_skips_the_lane_topic(redis_url, tmp_path):
    """agents/handoff.py: planned where its lane runs, a delivery is handed to the lane
    in memory (no entry on notify.send.<channel>.<priority>), with the same records
    and provider calls as with NOTIFY_HANDOFF=0, where it goes through the topic."""
    import redis

    users = [{"user_id": f"h{i}", "phone": f"+1555040{i:04d}", "email": f"h{i}@example.com", "version": 1}
             for i in range(12)]
    otps = [{"biz_key": f"otp:{u['user_id']}", "category": "otp", "template": "otp", "channels": ["sms"],
             "recipients": [u["user_id"]], "params": {"code": "123456"}} for u in users]
    seen = {}
    for handoff in ("1", "0"):
        sub = tmp_path / f"handoff{handoff}"
        sub.mkdir()
        redis.Redis.from_url(redis_url).flushall()
        pipe = Pipeline(redis_url, sub, partitions=PARTS)
        pipe.preferences(users)
        pipe.start("w0", NOTIFY_HANDOFF=handoff)
        try:
            pipe.events(otps)
            rows = pipe.wait_rows(lambda r: len(r) >= len(users) and all(v["status"] in ("ACCEPTED", "FAILED")
                                                                        for v in r.values()), 90, "every OTP settled")
        finally:
            pipe.stop()
        lane_entries = pipe.written("notify.send.sms.high")
        seen[handoff] = ({k: (v["status"], v["reason"]) for k, v in rows.items()}, pipe.attempts(), lane_entries)
        assert "Traceback" not in pipe.log("w0")
    # the first delivery of every OTP skipped the topic (a retry, scheduled on the timer
    # topic, comes back through it in both runs: a scenario number of the fakes times out)
    assert seen["0"][2] - seen["1"][2] == len(users)
    assert seen["1"][:2] == seen["0"][:2]
