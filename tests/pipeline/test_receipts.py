"""A receipt that does not come is polled for: ACCEPTED becomes DELIVERED only
from the provider's own answer, never by assumption."""

import pytest

from .harness import Pipeline


@pytest.fixture
def pipe(redis_url, tmp_path):
    p = Pipeline(redis_url, tmp_path, config="receipt_poll_s = 1\n")
    yield p
    p.stop()


def test_missing_receipt_is_polled_from_the_provider(pipe):
    pipe.preferences([{"user_id": "r1", "phone": "+15550001234", "version": 1}])
    pipe.start()
    pipe.events([{"biz_key": "rcpt:1", "category": "otp", "template": "otp", "channels": ["sms"],
                  "recipients": ["r1"], "params": {"code": "1"}}])
    rows = pipe.wait_rows(lambda r: r.get(("rcpt:1", "r1", "sms"), {}).get("status") == "DELIVERED", 60,
                          "DELIVERED after a poll")
    row = rows[("rcpt:1", "r1", "sms")]
    assert row["reason"] == "polled" and row["sent_at"] and row["delivered_at"] >= row["sent_at"]
