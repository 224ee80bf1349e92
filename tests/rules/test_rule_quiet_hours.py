"""pipeline.rules.quiet_hours: windows on the user's wall clock, across midnight and DST."""

import functools
from datetime import datetime, timezone
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings as hsettings, strategies as st

from pipeline.rules.quiet_hours import (
    defer_decision,
    in_window,
    load_zone,
    parse_quiet_hours,
    quiet_until,
)

NY = ZoneInfo("America/New_York")
SH = ZoneInfo("Asia/Shanghai")


def ts(zone, *args, fold=0):
    return datetime(*args, tzinfo=zone, fold=fold).timestamp()


def wall(t, zone):
    return datetime.fromtimestamp(t, zone)


@pytest.mark.parametrize(
    "value, expected",
    [("22:00-07:00", (1320, 420)), ("13:00-14:00", (780, 840)), ("00:00-23:59", (0, 1439)), (" 09:30 - 10:15 ", (570, 615))],
)
def test_parse_ok(value, expected):
    assert parse_quiet_hours(value) == expected


@pytest.mark.parametrize("value", ["", "22-07", "24:00-07:00", "22:60-07:00", "7:00-8:00", "10:00-10:00", "22:00", None, 5])
def test_parse_bad(value):
    with pytest.raises(ValueError):
        parse_quiet_hours(value)


@pytest.mark.parametrize("tz", ["", "Nowhere/Land", "../../etc/passwd", "/etc/localtime", "America", None])
def test_load_zone_bad(tz):
    with pytest.raises(ValueError):
        load_zone(tz)


def test_crossing_midnight_evening_part_ends_next_morning():
    now = ts(SH, 2024, 5, 1, 23, 15)
    assert quiet_until("22:00-07:00", "Asia/Shanghai", now) == ts(SH, 2024, 5, 2, 7, 0)


def test_crossing_midnight_morning_part_ends_same_day():
    now = ts(SH, 2024, 5, 2, 6, 59, 59)
    assert quiet_until("22:00-07:00", "Asia/Shanghai", now) == ts(SH, 2024, 5, 2, 7, 0)


def test_daytime_window():
    assert quiet_until("13:00-14:00", "Asia/Shanghai", ts(SH, 2024, 5, 2, 13, 0)) == ts(SH, 2024, 5, 2, 14, 0)


@pytest.mark.parametrize("window, hm", [("22:00-07:00", (7, 0)), ("22:00-07:00", (12, 0)), ("22:00-07:00", (21, 59)),
                                        ("13:00-14:00", (14, 0)), ("13:00-14:00", (12, 59))])
def test_outside_window_is_none(window, hm):
    assert quiet_until(window, "Asia/Shanghai", ts(SH, 2024, 5, 2, *hm)) is None


def test_same_instant_different_zones():
    now = datetime(2024, 5, 1, 15, 0, tzinfo=timezone.utc).timestamp()  # 23:00 in Shanghai, 11:00 in NY
    assert quiet_until("22:00-07:00", "Asia/Shanghai", now) is not None
    assert quiet_until("22:00-07:00", "America/New_York", now) is None


@pytest.mark.parametrize("quiet, tz", [(None, "UTC"), ("", "UTC"), ("bad", "UTC"), ("00:00-23:59", "Not/AZone")])
def test_bad_or_missing_settings_mean_no_quiet_hours(quiet, tz):
    assert quiet_until(quiet, tz, ts(SH, 2024, 5, 2, 3, 0)) is None


def test_dst_spring_forward_end_in_the_gap():
    # New York 2024-03-10: 02:00 EST jumps to 03:00 EDT; a window ending 02:30 ends at the jump.
    now = ts(NY, 2024, 3, 10, 1, 50)
    until = quiet_until("22:00-02:30", "America/New_York", now)
    assert until == ts(NY, 2024, 3, 10, 3, 0)
    assert until - now == 600


def test_dst_spring_forward_normal_end():
    now = ts(NY, 2024, 3, 9, 23, 0)
    until = quiet_until("22:00-07:00", "America/New_York", now)
    assert wall(until, NY).replace(tzinfo=None) == datetime(2024, 3, 10, 7, 0)
    assert until - now == 7 * 3600  # an hour shorter night


def test_dst_fall_back_ambiguous_end():
    # 2024-11-03: 01:00–01:59 happens twice. From the second 01:10, the window ends at the second 01:30.
    second = ts(NY, 2024, 11, 3, 1, 10, fold=1)
    assert quiet_until("00:00-01:30", "America/New_York", second) - second == 1200
    first = ts(NY, 2024, 11, 3, 1, 10, fold=0)
    assert quiet_until("00:00-01:30", "America/New_York", first) - first == 1200
    night = ts(NY, 2024, 11, 2, 23, 0)
    assert quiet_until("22:00-07:00", "America/New_York", night) - night == 9 * 3600  # an hour longer


def test_defer_decision():
    now = ts(SH, 2024, 5, 1, 23, 0)
    assert defer_decision("high", "22:00-07:00", "Asia/Shanghai", now) is None
    expected = ts(SH, 2024, 5, 2, 7, 0)
    assert defer_decision("normal", "22:00-07:00", "Asia/Shanghai", now) == expected
    assert defer_decision("low", "22:00-07:00", "Asia/Shanghai", now) == expected
    assert defer_decision("low", "22:00-07:00", "Asia/Shanghai", ts(SH, 2024, 5, 1, 12, 0)) is None
    assert defer_decision("low", None, "Asia/Shanghai", now) is None


ZONES = [
    "UTC",
    "Asia/Shanghai",
    "America/New_York",
    "Europe/London",
    "Australia/Lord_Howe",  # 30-minute DST
    "Pacific/Chatham",  # +12:45 / +13:45
    "America/Santiago",
    "Asia/Kolkata",
    "America/St_Johns",
]
hhmm = st.builds(lambda h, m: f"{h:02d}:{m:02d}", st.integers(0, 23), st.sampled_from([0, 15, 30, 45, 59]))
windows = st.builds(lambda a, b: f"{a}-{b}", hhmm, hhmm).filter(lambda w: w[:5] != w[6:])
nows = st.floats(min_value=946684800, max_value=2208988800, allow_nan=False)  # 2000–2040


@hsettings(max_examples=300, deadline=None)
@given(windows, st.sampled_from(ZONES), nows)
def test_quiet_until_properties(window, tz, now):
    start, end = parse_quiet_hours(window)
    zone = ZoneInfo(tz)
    until = quiet_until(window, tz, now)
    inside = in_window(start, end, wall(now, zone))
    assert (until is None) == (not inside)
    if until is not None:
        assert until > now
        assert until - now <= 25 * 3600
        assert not in_window(start, end, wall(until, zone))
        assert in_window(start, end, wall(max(now, until - 1), zone))  # the first instant outside


@functools.lru_cache(maxsize=None)
def transitions(tz: str, year: int) -> list[float]:
    """The year's UTC-offset changes in ``tz``, to the hour."""
    zone = ZoneInfo(tz)
    t0 = datetime(year, 1, 1, tzinfo=timezone.utc).timestamp()
    hours = [t0 + h * 3600 for h in range(366 * 24)]
    offsets = [wall(h, zone).utcoffset() for h in hours]
    return [hours[i] for i in range(1, len(hours)) if offsets[i] != offsets[i - 1]]


@hsettings(max_examples=100, deadline=None)
@given(windows, st.sampled_from(["America/New_York", "Europe/London", "Australia/Lord_Howe"]), st.data())
def test_quiet_until_properties_near_dst_transitions(window, tz, data):
    """Same invariants, with `now` drawn within a day of a DST transition."""
    zone = ZoneInfo(tz)
    year = data.draw(st.integers(2020, 2030))
    changes = transitions(tz, year)
    at = data.draw(st.sampled_from(changes))
    now = at + data.draw(st.floats(-86400, 86400))
    start, end = parse_quiet_hours(window)
    until = quiet_until(window, tz, now)
    assert (until is None) == (not in_window(start, end, wall(now, zone)))
    if until is not None:
        assert until > now
        assert not in_window(start, end, wall(until, zone))
        assert in_window(start, end, wall(max(now, until - 1), zone))


# --- quiet hours per channel (seed 002's preference store) ---------------------------

from pipeline.models import Preferences  # noqa: E402
from pipeline.rules.quiet_hours import channel_quiet_ends, channel_windows, quiet_until_any  # noqa: E402


def test_a_channel_uses_its_own_windows_else_the_users():
    p = Preferences(user_id="u", quiet_hours="22:00-07:00", channel_quiet_hours={"push": ["12:00-13:00"], "sms": []})
    assert channel_windows(p, "push") == ["12:00-13:00"]
    assert channel_windows(p, "sms") == []  # never quiet
    assert channel_windows(p, "email") == ["22:00-07:00"]
    assert channel_windows(Preferences(user_id="u"), "email") == []


def test_touching_windows_are_waited_out_one_after_the_other():
    noon = 1_800_000_000 - 1_800_000_000 % 86400 + 12 * 3600  # 12:00 UTC
    assert quiet_until_any(["11:00-13:00", "13:00-14:30"], "UTC", noon) == noon + 2.5 * 3600
    assert quiet_until_any(["11:00-13:00", "20:00-21:00"], "UTC", noon) == noon + 3600
    assert quiet_until_any(["20:00-21:00"], "UTC", noon) is None
    ends = channel_quiet_ends("normal", Preferences(user_id="u", channel_quiet_hours={"push": ["11:00-13:00"]}),
                              ["push", "email"], noon)
    assert ends == {"push": noon + 3600, "email": None}
    assert channel_quiet_ends("high", Preferences(user_id="u", quiet_hours="00:00-23:59"), ["sms"], noon) == {"sms": None}
