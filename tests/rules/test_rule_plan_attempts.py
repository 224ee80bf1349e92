"""The guard's plan and the attempt rules, tested directly (pure functions)."""

import time

from hypothesis import given, settings as hsettings
from hypothesis import strategies as st

from config.settings import load_settings
from pipeline.models import AttemptResult, Delivery, Intent, Preferences, State
from pipeline.rules.attempts import MAX_ATTEMPTS, after_query, after_send
from pipeline.rules.plan import plan_intent
from pipeline.templates import Renderer

S = load_settings(env={})
R = Renderer.from_settings(S)
NOW = 1_800_000_000.0


def intent(**kw):
    base = dict(notification_id="n_1", biz_key="b1", user_id="u1", category="transaction", template="order_shipped",
                template_version=1, priority="normal", accepted_at=NOW - 1,
                params={"order_no": "A1", "carrier": "UPS", "tracking_no": "T", "tracking_url": "https://t"})
    base.update(kw)
    return Intent(**base)


def plan(i, prefs=None, devices=None, seen=None, count=0, now=NOW, recent=None):
    return plan_intent(i, settings=S, renderer=R, prefs=prefs, devices=devices, now=now,
                       dedup_seen=lambda k: (seen or {}).get(k), count_today=lambda k: count,
                       recent_sends=lambda k: (recent or {}).get(k, []))


def states(p):
    return {o.channel: (o.state, o.reason) for o in p.outcomes}


def test_channels_fall_back_to_inbox_and_filter_the_rest():
    p = plan(intent(channels=["push", "sms"]), prefs=Preferences(user_id="u1"))
    assert states(p) == {"push": ("FILTERED", "unreachable"), "sms": ("FILTERED", "unreachable"),
                         "inbox": ("PENDING", None)}
    assert [d.channel for d in p.deliveries] == ["inbox"]


def test_opted_out_everywhere_and_no_fallback_for_otp():
    prefs = Preferences(user_id="u1", phone="+15550001000", switches={"otp.*": False})
    p = plan(intent(category="otp", template="otp", priority="high", channels=["sms"], params={"code": "1"}), prefs)
    assert states(p) == {"sms": ("FILTERED", "opted_out")} and not p.deliveries
    assert p.no_channel == "opted_out"  # counted on notify_no_channel_total for an alert
    p = plan(intent(category="otp", template="otp", priority="high", channels=["sms"], params={"code": "1"}),
             Preferences(user_id="u1"))
    assert p.no_channel == "unreachable" and not p.deliveries
    assert plan(intent(channels=["sms"]), Preferences(user_id="u1")).no_channel is None  # the inbox took it


def test_every_outcome_carries_the_preferences_version():
    prefs = Preferences(user_id="u1", phone="+15550001000", version=7, switches={"transaction.push": False})
    p = plan(intent(channels=["sms", "push"]), prefs)
    assert {o.channel: o.pref_version for o in p.outcomes} == {"sms": 7, "push": 7}
    assert [d.pref_version for d in p.deliveries] == [7]


def test_quiet_hours_defer_normal_but_not_high():
    hour = time.gmtime(NOW).tm_hour
    prefs = Preferences(user_id="u1", phone="+15550001000", quiet_hours=f"{(hour - 1) % 24:02d}:00-{(hour + 1) % 24:02d}:00")
    p = plan(intent(channels=["sms"]), prefs)
    assert states(p) == {"sms": ("SCHEDULED", "deferred")} and p.timer and p.timer.due_at > NOW
    assert p.timer.payload["resumed"] is True and p.timer.payload["channels"] == ["sms"]
    p = plan(intent(category="otp", template="otp", priority="high", channels=["sms"], params={"code": "1"}), prefs)
    assert states(p) == {"sms": ("PENDING", None)}


def test_dedup_then_daily_limit_in_seed_order():
    prefs = Preferences(user_id="u1", phone="+15550001000")
    p = plan(intent(channels=["sms"]), prefs, seen={"u1|b1|sms": NOW - 10})
    assert states(p) == {"sms": ("FILTERED", "duplicate")} and p.counter_key is None
    p = plan(intent(channels=["sms"]), prefs, count=20)  # transaction limit 20
    assert states(p) == {"sms": ("FILTERED", "over_limit")} and not p.dedup_keys
    p = plan(intent(category="otp", template="otp", priority="high", channels=["sms"], params={"code": "1"}),
             prefs, count=10_000)  # OTP exempt from the daily limit
    assert states(p) == {"sms": ("PENDING", None)} and p.counter_key is None


def test_template_errors_fail_only_that_channel():
    prefs = Preferences(user_id="u1", phone="+15550001000")
    p = plan(intent(template="welcome", channels=["sms", "inbox"], params={"url": "u"}), prefs)
    assert states(p)["sms"][0:2] == ("FAILED", "template_error")
    assert states(p)["inbox"] == ("PENDING", None)


def test_resumed_intent_reports_unsubscribed_and_does_not_fall_back():
    prefs = Preferences(user_id="u1", email="a@b.c", switches={"marketing.email": False})
    i = intent(category="marketing", template="promo", priority="low", channels=["email"], resumed=True,
               params={"headline": "h", "discount": "d", "url": "u"})
    p = plan(i, prefs)
    assert states(p) == {"email": ("FILTERED", "unsubscribed")} and not p.deliveries


def delivery(**kw):
    base = dict(delivery_id="n_1.sms", notification_id="n_1", biz_key="b", user_id="u", channel="sms",
                category="otp", template="otp", priority="high", address="+1555")
    base.update(kw)
    return Delivery(**base)


@hsettings(max_examples=200)
@given(st.sampled_from(AttemptResult.ALL), st.integers(0, MAX_ATTEMPTS - 1), st.floats(0, 1))
def test_after_send_never_resends_blindly_and_respects_the_budget(result, attempt, r):
    nxt = after_send(delivery(attempt=attempt), result, NOW, provider="sms_a", rand=lambda: r, retry_after=2.0)
    if result == AttemptResult.TIMEOUT_UNKNOWN:
        assert nxt.state == State.UNKNOWN and nxt.retry.unknown_provider == "sms_a"
    if nxt.retry is not None:
        assert nxt.retry.due_at >= NOW and nxt.retry.attempt == attempt + 1
        if result == AttemptResult.RATE_LIMITED:
            assert nxt.retry.due_at >= NOW + 2.0  # Retry-After is a lower bound
    if result in (AttemptResult.RATE_LIMITED, AttemptResult.TRANSIENT_ERROR) and attempt + 1 >= MAX_ATTEMPTS:
        assert (nxt.state, nxt.reason, nxt.dead_letter) == (State.FAILED, "retries_exhausted", True)
    if result == AttemptResult.ACCEPTED:
        assert nxt.state == State.ACCEPTED and nxt.retry is None


def test_after_query():
    d = delivery(unknown_provider="sms_a", attempt=1)
    assert after_query(d, "ACCEPTED", True, NOW, provider_msg_id="m").state == State.ACCEPTED
    assert after_query(d, "NOT_FOUND", True, NOW).resend_now
    assert after_query(d, "NOT_FOUND", False, NOW).state == State.REVIEW  # no query: never guess
    nxt = after_query(d, "ERROR", True, NOW)
    assert nxt.state == State.UNKNOWN and nxt.retry.reconcile_round == 1
    assert after_query(delivery(unknown_provider="sms_a", reconcile_round=2), "ERROR", True, NOW).state == State.REVIEW


def test_superseded_by_attempt_state_and_replay_round():
    from pipeline.rules.attempts import superseded

    assert not superseded(None, 0)
    assert not superseded({"a": 0, "s": "calling"}, 0)  # our own mark: its fate is reconciled, not skipped
    assert superseded({"a": 2, "s": "PENDING"}, 1)  # a later attempt was made
    assert superseded({"a": 1, "s": "FAILED"}, 1)  # this attempt finished
    assert not superseded({"a": 1, "s": "PENDING"}, 1)  # a retry of this attempt
    # a replay is the next round: runs once, then is done like any delivery
    assert not superseded({"a": 1, "s": "FAILED"}, 1, replay=1)
    assert not superseded({"a": 1, "s": "FAILED", "r": 0}, 1, replay=1)
    assert superseded({"a": 2, "s": "ACCEPTED", "r": 1}, 1, replay=1)
    assert superseded({"a": 2, "s": "ACCEPTED", "r": 1}, 0, replay=0)  # the old round, read again


def test_marketing_sliding_windows_refuse_as_rate_window_and_are_counted_once():
    promo = dict(category="marketing", template="promo", priority="low", channels=["email", "inbox"],
                 params={"headline": "h", "discount": "10%", "url": "https://x"})
    prefs = Preferences(user_id="u1", email="u1@example.com")
    p = plan(intent(**promo), prefs)
    assert [d.channel for d in p.deliveries] == ["email", "inbox"]
    assert p.window == ("u1|marketing", [NOW]) and p.counter_key  # one send time for the notification
    p = plan(intent(**promo, biz_key="b2"), prefs, recent={"u1|marketing": [NOW - 300]})
    assert states(p) == {"email": ("FILTERED", "rate_window"), "inbox": ("FILTERED", "rate_window")}
    assert p.window is None and p.counter_key is None and not p.dedup_keys  # refused: counted nowhere
    p = plan(intent(**promo, biz_key="b3"), prefs, recent={"u1|marketing": [NOW - 3000, NOW - 2000, NOW - 1000]})
    assert states(p)["email"] == ("FILTERED", "rate_window")  # the third in an hour already went
    # the daily cap is checked first (seed order), a category without windows is untouched
    p = plan(intent(**promo, biz_key="b4"), prefs, count=3, recent={"u1|marketing": [NOW - 300]})
    assert states(p)["email"] == ("FILTERED", "over_limit")
    assert plan(intent(), prefs).window is None


def test_each_channel_is_deferred_by_its_own_quiet_hours():
    hour = time.gmtime(NOW).tm_hour
    now_window = f"{(hour - 1) % 24:02d}:00-{(hour + 1) % 24:02d}:00"
    later_window = f"{(hour - 1) % 24:02d}:00-{(hour + 2) % 24:02d}:00"
    prefs = Preferences(user_id="u1", phone="+15550001000", email="u1@example.com", quiet_hours=now_window,
                        channel_quiet_hours={"sms": [], "email": [later_window]})
    p = plan(intent(channels=["sms", "email", "push", "inbox"]), prefs, devices=[["apns", "ab" * 32, 1.0]])
    st = states(p)
    # sms has no quiet hours of its own: now; push and inbox use the user's window; email its own
    assert st["sms"] == ("PENDING", None)
    assert st["email"] == st["push"] == st["inbox"] == ("SCHEDULED", "deferred")
    by_channels = {tuple(t.payload["channels"]): t for t in p.timers}
    assert set(by_channels) == {("email",), ("push", "inbox")}
    assert by_channels[("email",)].due_at - by_channels[("push", "inbox")].due_at == 3600
    assert {t.timer_id for t in p.timers} == {"n_1:intent:email", "n_1:intent:push+inbox"}
    # every channel waiting together keeps the one timer of before
    p = plan(intent(channels=["push", "inbox"]), prefs, devices=[["apns", "ab" * 32, 1.0]])
    assert [t.timer_id for t in p.timers] == ["n_1:intent"]


def test_backpressure_holds_throttled_categories_only():
    from pipeline.rules.backpressure import throttle

    promo = dict(category="marketing", template="promo", priority="low", channels=["inbox"],
                 params={"headline": "h", "discount": "10%", "url": "https://x"})
    prefs = Preferences(user_id="u1", phone="+15550001000")
    p = plan_intent(intent(**promo), settings=S, renderer=R, prefs=prefs, devices=None, now=NOW,
                    dedup_seen=lambda k: None, count_today=lambda k: 0, backpressure=True)
    assert states(p) == {"inbox": ("SCHEDULED", "backpressure")} and not p.deliveries and not p.dedup_keys
    t = p.timers[0]
    assert (t.timer_id, t.due_at, t.payload["deferrals"]) == ("n_1:backpressure:0", NOW + S.backpressure.retry_s, 1)
    # transactional and OTP never wait for it
    p = plan_intent(intent(channels=["sms"]), settings=S, renderer=R, prefs=prefs, devices=None, now=NOW,
                    dedup_seen=lambda k: None, count_today=lambda k: 0, backpressure=True)
    assert states(p) == {"sms": ("PENDING", None)}
    # the throttle: on past after_s, off under half of it, and as it was between
    assert throttle(False, 61, 60) and throttle(True, 45, 60) and not throttle(False, 45, 60)
    assert not throttle(True, 29, 60)
