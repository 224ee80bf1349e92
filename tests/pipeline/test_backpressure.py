"""Backpressure (issue 20, item 2): a backlog made on purpose (an e-mail provider
answering in 1 s, one call at a time) pushes the oldest unprocessed entry past
`after_s`: marketing waits (SCHEDULED backpressure) while transactional traffic
goes on, and marketing resumes by itself once the backlog is gone."""

import time

from tests.pipeline.harness import Pipeline
from tests.transport.helpers import wait_until

CONFIG = """
receipt_poll_s = 0

[backpressure]
after_s = 3
retry_s = 1

[channels.email]
lane_batch_size = 1

[providers.email]
kind = "fake"
channel = "email"
latency_s = 1.0

[providers.apns]
kind = "fake"
channel = "push"

[providers.fcm]
kind = "fake"
channel = "push"

[providers.sms_a]
kind = "fake"
channel = "sms"

[providers.webhook]
kind = "fake"
channel = "webhook"

[routes]
push = ["apns", "fcm"]
sms = ["sms_a"]
email = ["email"]
webhook = ["webhook"]
"""

SHIP = {"category": "transaction", "template": "order_shipped",
        "params": {"order_no": "1", "carrier": "UPS", "tracking_no": "1Z", "tracking_url": "https://t.example/x"}}
PROMO = {"category": "marketing", "template": "promo", "channels": ["inbox"],
         "params": {"headline": "Sale", "discount": "10%", "url": "https://s.example"}}


def test_marketing_waits_while_the_lanes_are_behind_and_resumes_by_itself(redis_url, tmp_path):
    pipe = Pipeline(redis_url, tmp_path, config=CONFIG)
    try:
        users = [{"user_id": f"bp{i}", "version": 1, "email": f"bp{i}@example.com"} for i in range(12)]
        pipe.preferences(users)
        proc = pipe.start()
        wait_until(lambda: "Worker ready" in pipe.log() or proc.poll() is not None, 60, 0.1, "the worker ready")
        # twelve e-mails, one second each, one at a time: a backlog
        pipe.events([{**SHIP, "biz_key": f"mail:{i}", "recipients": [f"bp{i}"], "channels": ["email"]}
                     for i in range(12)])
        wait_until(lambda: "backpressure on" in pipe.log(), 30, 0.2, "backpressure on")
        pipe.events([{**PROMO, "biz_key": "promo:1", "recipients": ["bp0"]},
                     {**SHIP, "biz_key": "ship:inbox", "recipients": ["bp1"], "channels": ["inbox"]}])
        rows = pipe.wait_rows(lambda r: ("promo:1", "bp0", "inbox") in r and ("ship:inbox", "bp1", "inbox") in r
                              and r[("ship:inbox", "bp1", "inbox")]["status"] == "DELIVERED", 30,
                              "the transactional inbox delivered")
        # the transactional notification went through; the marketing one waits
        assert (rows[("promo:1", "bp0", "inbox")]["status"], rows[("promo:1", "bp0", "inbox")]["reason"]) == \
            ("SCHEDULED", "backpressure")
        # the backlog drains; the throttle goes off by itself and the promotion is delivered
        rows = pipe.wait_rows(lambda r: r[("promo:1", "bp0", "inbox")]["status"] == "DELIVERED", 60,
                              "the promotion delivered after the backlog")
        assert "backpressure off" in pipe.log()
        mails = [v for k, v in rows.items() if k[0].startswith("mail:")]
        assert len(mails) == 12 and all(v["status"] == "ACCEPTED" for v in mails)
    finally:
        pipe.stop()
