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


def plan(i, prefs=None, devices=None, seen=None, count=0, now=NOW):
    return plan_intent(i, settings=S, renderer=R, prefs=prefs, devices=devices, now=now,
                       dedup_seen=lambda k: (seen or {}).get(k), count_today=lambda k: count)


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
