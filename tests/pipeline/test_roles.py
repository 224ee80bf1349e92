"""Worker roles (pipeline/roles.py): the high-priority path in a process of its own."""

import pytest

from pipeline import roles

from .harness import Pipeline

AGENTS = ["expand", "expand.high", "guard.low", "guard.normal", "guard.high", "lane.sms.high", "lane.email.low",
          "lane.push.normal", "records", "receipts", "scheduler", "preferences", "devices"]


@pytest.mark.parametrize("name", AGENTS)
def test_every_agent_runs_in_exactly_one_of_main_and_priority_or_in_both_if_shared(name):
    assert roles.runs(name, "all")
    both = roles.runs(name, "main") and roles.runs(name, "priority")
    assert both == (name in roles.SHARED_AGENTS)
    assert roles.runs(name, "main") or roles.runs(name, "priority")
    assert roles.runs(name, "priority") == (name.endswith(".high") or name in roles.SHARED_AGENTS)


def test_priority_role_is_a_group_of_its_own():
    assert roles.app_id("priority") != roles.app_id("main") == roles.app_id("all") == "notify"


def test_main_and_priority_workers_together_deliver_every_priority(redis_url, tmp_path):
    pipe = Pipeline(redis_url, tmp_path)
    users = [{"user_id": f"r{i}", "phone": f"+1555010{i:04d}", "email": f"r{i}@example.com", "version": 1}
             for i in range(20, 30)]
    pipe.preferences(users)
    pipe.start("main", NOTIFY_ROLE="main")
    pipe.start("priority", NOTIFY_ROLE="priority")
    try:
        for group in ("notify", "notify-priority"):  # each role keeps its own copy of the preferences
            pipe.wait_committed({"notify.preferences": len(users)}, group=group)
        pipe.events([{"biz_key": f"otp:{u['user_id']}", "category": "otp", "template": "otp", "channels": ["sms"],
                      "recipients": [u["user_id"]], "params": {"code": "123456"}} for u in users]
                     + [{"biz_key": f"ship:{u['user_id']}", "category": "transaction", "template": "order_shipped",
                         "channels": ["email"], "recipients": [u["user_id"]],
                         "params": {"order_no": "o1", "carrier": "UPS", "tracking_no": "1Z", "tracking_url": "https://t.example/1Z"}}
                        for u in users])
        rows = pipe.wait_rows(lambda r: len(r) >= 2 * len(users) and all(
            v["status"] == "ACCEPTED" for v in r.values()), 60, "every notification accepted")
    finally:
        pipe.stop()
    assert {k[0].split(":")[0] for k in rows} == {"otp", "ship"}
    # the OTPs went through the priority group, the rest through the main group
    assert pipe.committed("notify.events.high", "notify-priority") == len(users)
    assert pipe.committed("notify.events.high", "notify") == 0
    assert pipe.committed("notify.send.sms.high", "notify-priority") == len(users)
    assert pipe.committed("notify.events", "notify") == len(users)
    assert "Traceback" not in pipe.log("main") + pipe.log("priority")
