"""Quiet hours per channel (issue 24, item 2): set through the API as a user
would, planned by a real worker: each channel waits out its own windows."""

import time

from tests.pipeline.harness import Pipeline
from tests.api.conftest import api, api_app_factory  # noqa: F401
from tests.transport.helpers import wait_until


def test_each_channel_waits_for_its_own_quiet_hours(redis_url, tmp_path):
    hour = time.gmtime().tm_hour
    quiet_now = f"{(hour - 1) % 24:02d}:00-{(hour + 2) % 24:02d}:00"
    pipe = Pipeline(redis_url, tmp_path)
    try:
        # the user's window covers now; sms has none of its own, so it goes now
        pipe.preferences([{"user_id": "cq1", "version": 1, "tz": "UTC", "phone": "+15550007001",
                           "email": "cq1@example.com", "quiet_hours": quiet_now,
                           "channel_quiet_hours": {"sms": [], "inbox": ["03:00-03:30"]}}])
        proc = pipe.start()
        wait_until(lambda: "Worker ready" in pipe.log() or proc.poll() is not None, 60, 0.1, "the worker ready")
        pipe.events([{"biz_key": "cq:1", "category": "transaction", "template": "order_shipped",
                      "recipients": ["cq1"], "channels": ["sms", "email", "inbox"],
                      "params": {"order_no": "1", "carrier": "UPS", "tracking_no": "1Z",
                                 "tracking_url": "https://t.example/x"}}])
        rows = pipe.wait_rows(lambda r: len(r) == 3 and r[("cq:1", "cq1", "sms")]["status"] not in ("PENDING",),
                              60, "three records, sms sent")
        got = {k[2]: (v["status"], v["reason"]) for k, v in rows.items()}
        assert got["sms"][0] in ("ACCEPTED", "DELIVERED")
        assert got["email"] == ("SCHEDULED", "deferred")
        inbox_quiet = 3 * 60 <= time.gmtime().tm_hour * 60 + time.gmtime().tm_min < 3 * 60 + 30
        assert got["inbox"] == (("SCHEDULED", "deferred") if inbox_quiet else ("DELIVERED", "in_inbox"))
    finally:
        pipe.stop()


async def test_the_api_takes_per_channel_windows_and_refuses_bad_ones(api):
    ok = {"tz": "Europe/Paris", "quiet_hours": "22:00-07:00",
          "channel_quiet_hours": {"push": ["22:00-07:00", "12:00-13:00"], "sms": []}}
    status, body = await api.call("PUT", "/v1/users/cq2/preferences", "users", json=ok)
    assert status == 202, body
    for bad, field in (({"push": ["22:00-07:00\n"]}, "channel_quiet_hours.push"),
                       ({"push": "22:00-07:00"}, "channel_quiet_hours.push"),
                       ({"fax": []}, "channel_quiet_hours"),
                       ({"push": ["07:00-07:00"]}, "channel_quiet_hours.push")):
        status, body = await api.call("PUT", "/v1/users/cq2/preferences", "users",
                                      json={"channel_quiet_hours": bad})
        assert status == 400 and body["error"]["field"] == field, (bad, body)
