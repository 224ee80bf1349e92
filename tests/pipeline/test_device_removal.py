"""A dead push token is removed as of when the provider says it died (APNs 410's
timestamp): a token registered again after that stays (issue 28). Against a real
worker: the device table decides whether a later push has an address."""

from tests.pipeline.harness import Pipeline, push_event
from tests.transport.helpers import wait_until

TOKEN = "ab" * 32


def test_a_removal_older_than_the_registration_keeps_the_device(redis_url, tmp_path):
    pipe = Pipeline(redis_url, tmp_path)
    try:
        pipe.devices([{"user_id": "dv1", "token": TOKEN, "platform": "apns", "op": "add", "at": 1000.0},
                      {"user_id": "dv2", "token": TOKEN, "platform": "apns", "op": "add", "at": 1000.0}])
        # dv1's token was reported dead before it was registered again: kept; dv2's after: removed
        pipe.devices([{"user_id": "dv1", "token": TOKEN, "op": "remove", "at": 900.0},
                      {"user_id": "dv2", "token": TOKEN, "op": "remove", "at": 1100.0}])
        proc = pipe.start()
        wait_until(lambda: "Worker ready" in pipe.log() or proc.poll() is not None, 60, 0.1, "the worker ready")
        pipe.events([push_event("dv:1", "dv1"), push_event("dv:2", "dv2")])
        rows = pipe.wait_rows(lambda r: ("dv:1", "dv1", "push") in r and ("dv:2", "dv2", "push") in r
                              and r[("dv:2", "dv2", "push")]["status"] != "PENDING", 60, "both pushes decided")
        assert rows[("dv:1", "dv1", "push")]["status"] in ("ACCEPTED", "DELIVERED")
        assert (rows[("dv:2", "dv2", "push")]["status"], rows[("dv:2", "dv2", "push")]["reason"]) == \
            ("FILTERED", "unreachable")
    finally:
        pipe.stop()
