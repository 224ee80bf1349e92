"""pipeline.rules.guard: seed 000's GUARD order, day keys in the user's zone."""

from datetime import datetime, timezone

import pytest
from hypothesis import given, strategies as st

from pipeline.rules.guard import (
    COUNTER_TTL_S,
    DUPLICATE,
    OVER_LIMIT,
    PASS,
    check,
    counter_key,
    day_key,
    dedup_expired,
    dedup_key,
    is_duplicate,
)

NOW = 1_700_000_000.0


@pytest.mark.parametrize(
    "seen, window, count, limit, expected",
    [
        (None, 300, 0, 3, PASS),
        (None, 300, 2, 3, PASS),
        (None, 300, 3, 3, OVER_LIMIT),
        (None, 300, 99, None, PASS),  # exempt
        (None, 300, 0, 0, OVER_LIMIT),
        (NOW - 10, 300, 0, 3, DUPLICATE),
        (NOW - 10, 300, 3, 3, DUPLICATE),  # dedup is checked first
        (NOW - 300, 300, 0, 3, PASS),  # expired exactly at the window's end
        (NOW - 301, 300, 3, 3, OVER_LIMIT),
        (NOW + 5, 300, 0, 3, DUPLICATE),  # clock skew: seen "in the future"
        (NOW, 0, 0, 3, PASS),  # window 0 = no dedup
    ],
)
def test_check(seen, window, count, limit, expected):
    assert check(seen, NOW, window, count, limit) == expected


finite = st.floats(min_value=0, max_value=4e9, allow_nan=False)


@given(st.none() | finite, finite, st.integers(0, 10**6), st.integers(0, 1000), st.none() | st.integers(0, 1000))
def test_check_properties(seen, now, window, count, limit):
    result = check(seen, now, window, count, limit)
    within = seen is not None and now - seen < window
    assert (result == DUPLICATE) == within
    assert (result == OVER_LIMIT) == (not within and limit is not None and count >= limit)
    assert is_duplicate(seen, now, window) == within


def test_day_key_uses_the_users_zone():
    ts = datetime(2024, 1, 1, 20, 0, tzinfo=timezone.utc).timestamp()
    assert day_key("UTC", ts) == "2024-01-01"
    assert day_key("Asia/Shanghai", ts) == "2024-01-02"
    assert day_key("America/Los_Angeles", ts) == "2024-01-01"
    assert day_key("Pacific/Kiritimati", datetime(2024, 1, 1, 10, 0, tzinfo=timezone.utc).timestamp()) == "2024-01-02"


@pytest.mark.parametrize("tz", [None, "", "Not/AZone", "../../etc/passwd", "/etc/localtime"])
def test_day_key_bad_zone_is_utc(tz):
    ts = datetime(2024, 1, 1, 23, 59, tzinfo=timezone.utc).timestamp()
    assert day_key(tz, ts) == "2024-01-01"


def test_counter_key():
    assert counter_key("u:1", "marketing", "2024-01-02") == "freq:u:1:marketing:2024-01-02"
    assert counter_key("u:1", "marketing", "2024-01-02").rsplit(":", 2)[1:] == ["marketing", "2024-01-02"]
    assert COUNTER_TTL_S == 2 * 86400


def test_dedup_key_ignores_param_order():
    a = dedup_key("u1", "promo", {"a": 1, "b": [1, 2]})
    assert a == dedup_key("u1", "promo", {"b": [1, 2], "a": 1})
    assert a != dedup_key("u2", "promo", {"a": 1, "b": [1, 2]})
    assert a != dedup_key("u1", "promo", {"a": 2, "b": [1, 2]})
    assert dedup_key("u1", "promo", None) == dedup_key("u1", "promo", {})
    assert dedup_key("u1", "promo", {"x": object()})  # not JSON: still a key


@given(st.floats(0, 1e6), st.floats(0, 1e6), st.sampled_from(["otp", "marketing", "gone"]))
def test_dedup_entry_expires_with_its_own_categorys_window(seen_at, age, category):
    """The purge drops an entry exactly when the guard would no longer call a repeat
    a duplicate: per category, not after the longest window of all."""
    windows = {"otp": 300, "marketing": 86400}
    now = seen_at + age
    expired = dedup_expired([seen_at, 7, category], now, windows)
    window = windows.get(category, 86400)
    assert expired == (not is_duplicate(seen_at, now, window))
    assert dedup_expired([seen_at, 7], now, windows) == (now - seen_at >= 86400)  # written before categories


# --- seed 002's sliding windows ---------------------------------------------------

from hypothesis import given as _given  # noqa: E402
from hypothesis import strategies as _st  # noqa: E402

from pipeline.rules.guard import window_after, window_expired, window_refused  # noqa: E402

_WINDOWS = _st.lists(_st.tuples(_st.integers(1, 3600), _st.integers(0, 5)), min_size=1, max_size=3).map(
    lambda ws: tuple(sorted(set(ws))))


@_given(_WINDOWS, _st.lists(_st.floats(0, 5000, allow_nan=False), max_size=60))
def test_windows_decide_as_the_seeds_zset_with_bounded_state(windows, gaps):
    """Against the reference (every send time ever, as the seed's ZSET holds them):
    the same decision for every attempt, keeping at most the largest n times."""
    now, zset, kept = 10_000.0, [], []
    for gap in gaps:
        now += gap
        model = any(sum(1 for t in zset if t > now - w) >= n for w, n in windows)
        assert window_refused(kept, now, windows) == model
        if not model:
            zset.append(now)
            kept = window_after(kept, now, windows)
            assert len(kept) <= max(n for _w, n in windows)


def test_one_in_ten_minutes_and_three_in_an_hour():
    w = ((600, 1), (3600, 3))
    times: list[float] = []
    sent = []
    for t in (0, 100, 601, 1202, 1803, 3601, 4202):
        if not window_refused(times, t, w):
            times = window_after(times, t, w)
            sent.append(t)
    # 100: inside 10 minutes of 0; 1803: the fourth in an hour; 3601: the hour since 0 has passed
    assert sent == [0, 601, 1202, 3601, 4202]
    assert window_expired([0.0, 10.0], 3611.0, 3600) and not window_expired([0.0, 12.0], 3611.0, 3600)
    assert window_expired("junk", 0, 3600)
