"""pipeline.rules.channels: requested ∩ switched on ∩ reachable, inbox fallback, reasons."""

import pytest
from hypothesis import given, strategies as st

from config.settings import CHANNELS, CategoryConfig
from pipeline.models import Preferences
from pipeline.rules.channels import (
    OPTED_OUT,
    UNREACHABLE,
    address_for,
    is_reachable,
    is_unsubscribed,
    pick_channels,
    switch_on,
)

MARKETING = CategoryConfig("marketing", "low", 3, 86400, True, ("push", "email"))
OTP = CategoryConfig("otp", "high", None, 60, False, ("sms",))
FULL = dict(phone="+15550001111", email="a@example.com", webhook_url="https://h.example/x")


def prefs(switches=None, **kw):
    return Preferences(user_id="u1", switches=switches or {}, **kw)


@pytest.mark.parametrize(
    "switches, category, channel, expected",
    [
        ({}, "marketing", "sms", True),
        ({"marketing.sms": False}, "marketing", "sms", False),
        ({"marketing.sms": False}, "marketing", "email", True),
        ({"marketing.sms": False}, "otp", "sms", True),
        ({"*.sms": False}, "otp", "sms", False),
        ({"marketing.*": False}, "marketing", "push", False),
        ({"marketing.*": False, "marketing.push": True}, "marketing", "push", True),  # exact wins
        ({"*.sms": False, "otp.sms": True}, "otp", "sms", True),
        ({"*.sms": False, "otp.*": True}, "otp", "sms", False),  # tie between wildcards: off wins
        ({"*.sms": True, "otp.*": False}, "otp", "sms", False),
        ({"*.sms": True, "otp.*": True}, "otp", "sms", True),
        ({"*.*": False}, "otp", "sms", False),
        ({"*.*": False, "*.sms": True}, "otp", "sms", True),
    ],
)
def test_switch_lookup(switches, category, channel, expected):
    p = prefs(switches)
    assert switch_on(p, category, channel) is expected
    assert is_unsubscribed(p, category, channel) is (not expected)


def test_no_prefs_means_everything_on():
    assert switch_on(None, "marketing", "sms") and not is_unsubscribed(None, "marketing", "sms")


def test_addresses_and_reachability():
    p = prefs(**FULL)
    assert address_for(p, "sms") == FULL["phone"]
    assert address_for(p, "email") == FULL["email"]
    assert address_for(p, "webhook") == FULL["webhook_url"]
    assert address_for(p, "inbox") is None and address_for(None, "sms") is None
    assert is_reachable("inbox", None, False)
    assert is_reachable("push", None, True) and not is_reachable("push", p, False)
    assert not is_reachable("sms", prefs(), True)
    assert not is_reachable("fax", p, True)


def test_requested_channels_kept_in_order():
    assert pick_channels(["sms", "email", "push"], MARKETING, prefs(**FULL), True) == (["sms", "email", "push"], None)


def test_defaults_when_nothing_requested():
    assert pick_channels(None, MARKETING, prefs(**FULL), True) == (["push", "email"], None)
    assert pick_channels([], OTP, prefs(**FULL), True) == (["sms"], None)


def test_switched_off_and_unreachable_dropped():
    p = prefs({"marketing.email": False}, phone="+15550001111")
    assert pick_channels(["email", "sms", "push", "webhook"], MARKETING, p, False) == (["sms"], None)


def test_duplicates_and_unknown_dropped():
    assert pick_channels(["sms", "sms", "fax"], OTP, prefs(**FULL), True) == (["sms"], None)


def test_inbox_fallback_when_unreachable():
    assert pick_channels(["sms"], MARKETING, prefs(), False) == (["inbox"], None)


def test_inbox_fallback_when_opted_out():
    assert pick_channels(["sms"], MARKETING, prefs({"*.sms": False}, **FULL), True) == (["inbox"], None)


def test_no_fallback_when_inbox_switched_off():
    p = prefs({"marketing.sms": False, "marketing.inbox": False}, **FULL)
    assert pick_channels(["sms"], MARKETING, p, True) == ([], OPTED_OUT)
    assert pick_channels(["sms"], MARKETING, prefs({"marketing.inbox": False}), True) == ([], UNREACHABLE)


def test_category_without_fallback():
    assert pick_channels(["sms"], OTP, prefs(), True) == ([], UNREACHABLE)
    assert pick_channels(["sms"], OTP, prefs({"otp.sms": False}, **FULL), True) == ([], OPTED_OUT)
    # one channel off, the other unreachable: not everything was switched off
    p = prefs({"otp.sms": False})
    assert pick_channels(["sms", "email"], OTP, p, True) == ([], UNREACHABLE)


channel_lists = st.none() | st.lists(st.sampled_from(CHANNELS + ("fax",)), max_size=7)
switch_dicts = st.dictionaries(
    st.builds(
        lambda c, ch: f"{c}.{ch}",
        st.sampled_from(["marketing", "otp", "*"]),
        st.sampled_from(CHANNELS + ("*",)),
    ),
    st.booleans(),
)
pref_st = st.none() | st.builds(
    lambda sw, phone, email, hook: prefs(sw, phone=phone, email=email, webhook_url=hook),
    switch_dicts,
    st.none() | st.just("+15550001111"),
    st.none() | st.just("a@example.com"),
    st.none() | st.just("https://h.example/x"),
)


@given(channel_lists, st.sampled_from([MARKETING, OTP]), pref_st, st.booleans())
def test_pick_channels_properties(requested, cat, p, has_device):
    chosen, reason = pick_channels(requested, cat, p, has_device)
    base = requested or list(cat.default_channels)
    assert set(chosen) <= set(base) | {"inbox"}
    assert len(chosen) == len(set(chosen))
    assert (reason is None) == bool(chosen)
    assert reason in (None, OPTED_OUT, UNREACHABLE)
    for ch in chosen:
        assert switch_on(p, cat.name, ch) and is_reachable(ch, p, has_device)
    if chosen == ["inbox"] and "inbox" not in base:
        assert cat.inbox_fallback
    if reason == OPTED_OUT:
        assert all(not switch_on(p, cat.name, ch) for ch in base if ch in CHANNELS)
