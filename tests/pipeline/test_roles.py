"""Worker roles (pipeline/roles.py): the high-priority path in a process of its own."""

import os

import pytest

from config.settings import CHANNELS, load_settings
from pipeline import roles
from pipeline import topics as T

from .harness import Pipeline


@pytest.mark.parametrize("topic", T.ALL)
def test_every_topic_is_read_in_exactly_one_of_main_and_priority_or_in_both_if_shared(topic):
    assert roles.runs(topic, "all")
    both = roles.runs(topic, "main") and roles.runs(topic, "priority")
    assert both == (topic in roles.SHARED)
    assert roles.runs(topic, "main") or roles.runs(topic, "priority")
    assert roles.runs(topic, "priority") == (topic.endswith(".high") or topic in roles.SHARED)


def _agents(role):
    from agents import register_agents
    from config.settings import load_settings
    from pipeline.app import create_app

    app = create_app(load_settings(env={}), role)
    register_agents(app)
    return set(app.agents)


def test_the_priority_role_runs_the_high_priority_path_and_the_user_tables():
    every = _agents("all")
    high = {"expand.high", "guard.high", "scheduler.high"} | {f"lane.{c}.high" for c in CHANNELS}
    assert _agents("priority") == high | {"preferences", "devices"}
    assert _agents("main") == every - high


def test_an_otp_retry_is_held_and_fired_by_the_priority_process_alone(redis_url, tmp_path):
    """A high-priority delivery's timer (here the reconciliation after a call whose
    answer never came) goes on notify.timers.high, held and fired by the process
    that runs the high path: with no main worker running at all, the OTPs are
    reconciled and ACCEPTED. Before, the retry went on notify.timers and waited for
    the main workers' scheduler, behind whatever campaign kept them busy."""
    # sms_a's breaker kept closed: six timeouts in a row would send the rest to sms_b
    pipe = Pipeline(redis_url, tmp_path, config="receipt_poll_s = 0\n[breaker]\nfailure_threshold = 1000\n")
    users = [{"user_id": f"t{i}", "phone": f"+1555{i:04d}0004", "version": 1} for i in range(6)]  # ...0004: no answer
    pipe.preferences(users)
    pipe.start("priority", NOTIFY_ROLE="priority")
    try:
        pipe.wait_committed({"notify.preferences": len(users)}, group="notify-priority")
        pipe.events([{"biz_key": f"otp:{u['user_id']}", "category": "otp", "template": "otp", "channels": ["sms"],
                      "recipients": [u["user_id"]], "params": {"code": "123456"}} for u in users],
                    after_users=False)  # applied by the priority group (waited for above): no main group runs
        rows = pipe.wait_rows(lambda r: len(r) == len(users) and all(
            v["status"] == "ACCEPTED" for v in r.values()), 60, "every OTP reconciled")
    finally:
        pipe.stop()
    assert {v["reason"] for v in rows.values()} == {"reconciled"}
    assert pipe.written("notify.timers.high") >= len(users) and pipe.written("notify.timers") == 0
    assert "Traceback" not in pipe.log("priority")


def test_priority_role_is_a_group_of_its_own():
    assert roles.app_id("priority") != roles.app_id("main") == roles.app_id("all") == "notify"


def test_main_and_priority_workers_together_deliver_every_priority(redis_url, tmp_path):
    pipe = Pipeline(redis_url, tmp_path)
    users = [{"user_id": f"r{i}", "phone": f"+1555010{i:04d}", "email": f"r{i}@example.com", "version": 1}
             for i in range(20, 30)]
    pipe.preferences(users)
    main = pipe.start("main", NOTIFY_ROLE="main")
    prio = pipe.start("priority", NOTIFY_ROLE="priority")
    try:
        for group in ("notify", "notify-priority"):  # each role keeps its own copy of the preferences
            pipe.wait_committed({"notify.preferences": len(users)}, group=group)
        # the main worker gave up CPU priority, so the kernel runs the priority worker first
        ours = os.getpriority(os.PRIO_PROCESS, 0)
        assert os.getpriority(os.PRIO_PROCESS, main.pid) == min(19, ours + load_settings(env={}).env.main_nice)
        assert os.getpriority(os.PRIO_PROCESS, prio.pid) == ours
        # and it runs in the idle class, its event loop and every thread of it but the
        # starter and the record store's writer it started (pipeline/threads.py: a holder
        # of SQLite's write lock must not be starved), which keep the nice increment only
        tids = [int(t) for t in os.listdir(f"/proc/{main.pid}/task")]
        assert os.sched_getscheduler(main.pid) == os.SCHED_IDLE
        ordinary = [t for t in tids if os.sched_getscheduler(t) != os.SCHED_IDLE]
        assert len(ordinary) <= 2 and len(tids) - len(ordinary) >= 2
        assert all(os.sched_getscheduler(t) == os.SCHED_OTHER for t in ordinary)
        assert all(os.getpriority(os.PRIO_PROCESS, t) == os.getpriority(os.PRIO_PROCESS, main.pid) for t in tids)
        assert os.sched_getscheduler(prio.pid) == os.sched_getscheduler(0)
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
    # their deliveries called by the priority process's SMS lane (handed to it in memory,
    # agents/handoff.py, or read from the lane's topic by that group alone)
    assert pipe.committed("notify.send.sms.high", "notify-priority") == pipe.written("notify.send.sms.high")
    assert pipe.committed("notify.send.sms.high", "notify") == 0
    assert pipe.written("notify-priority-inflight-changelog") > 0  # its "calling" marks
    assert pipe.committed("notify.events", "notify") == len(users)
    assert "Traceback" not in pipe.log("main") + pipe.log("priority")


def test_offset_peers_pair_the_groups_on_the_priority_topics_only():
    for role, other in (("all", "notify-priority"), ("main", "notify-priority"), ("priority", "notify")):
        peers = roles.offset_peers(role)
        assert set(peers) == set(T.PRIORITY)
        assert all(groups == (other,) for groups in peers.values())


def test_switching_roles_either_way_goes_on_where_the_other_group_stopped(redis_url, tmp_path):
    """all → main + priority → all: each time the group that takes over the high
    topics starts where the other stopped, so no OTP is planned (or sent) twice."""
    # deliveries through the lane's topic (no hand-off in memory, the default): its entries count the plans
    pipe = Pipeline(redis_url, tmp_path, NOTIFY_HANDOFF="0")
    users = [{"user_id": f"s{i}", "phone": f"+1555020{i:04d}", "version": 1} for i in range(20, 26)]
    pipe.preferences(users)

    def otps(round_: int) -> None:
        pipe.events([{"biz_key": f"otp{round_}:{u['user_id']}", "category": "otp", "template": "otp",
                      "channels": ["sms"], "recipients": [u["user_id"]], "params": {"code": "123456"}}
                     for u in users])
        n = round_ * len(users)
        pipe.wait_rows(lambda r: sum(v["status"] == "ACCEPTED" for v in r.values()) >= n, 60, f"{n} OTPs accepted")
        pipe.wait_committed({"notify.events.high": n, "notify.send.sms.high": n}, group=group)

    try:
        group = "notify"
        pipe.start("all-1")
        otps(1)
        pipe.stop()

        group = "notify-priority"
        pipe.start("main", NOTIFY_ROLE="main", NOTIFY_MAIN_NICE="0")
        pipe.start("priority", NOTIFY_ROLE="priority")
        otps(2)
        pipe.stop()

        group = "notify"
        pipe.start("all-2")
        otps(3)
    finally:
        pipe.stop()
    # each event planned once: a group starting from the earliest entry (or from its
    # own position of before the switch) would have planned the earlier rounds again;
    # planned where it was read (one worker per role holds every user's tables), no
    # OTP went through notify.intents.high
    assert pipe.written("notify.send.sms.high") == 3 * len(users)
    assert pipe.written("notify.intents.high") == 0
    assert sum(pipe.attempts().values()) == 3 * len(users)
    logs = "".join(pipe.log(n) for n in ("all-1", "main", "priority", "all-2"))
    assert "Traceback" not in logs
