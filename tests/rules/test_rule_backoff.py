"""pipeline.rules.backoff: seed 000's jittered exponential backoff and Retry-After."""

import math
from email.utils import format_datetime
from datetime import datetime, timezone

import pytest
from hypothesis import given, strategies as st

from pipeline.rules.backoff import BASE_S, CAP_S, backoff_s, cap_for, parse_retry_after, retry_at


def test_seed_values():
    assert (BASE_S, CAP_S) == (1.0, 600.0)
    assert [cap_for(a) for a in range(12)] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 600, 600]
    assert backoff_s(3, rand=lambda: 0.0) == 4.0
    assert backoff_s(3, rand=lambda: 1.0) == 8.0
    assert backoff_s(20, rand=lambda: 0.5) == 450.0


def test_huge_and_negative_attempts():
    assert cap_for(10**6) == CAP_S
    assert backoff_s(5000, rand=lambda: 1.0) == CAP_S
    with pytest.raises(ValueError):
        backoff_s(-1)


def test_bad_random_source_is_clamped():
    assert backoff_s(3, rand=lambda: 7.0) == 8.0
    assert backoff_s(3, rand=lambda: -1.0) == 4.0
    assert backoff_s(3, rand=lambda: math.nan) in (4.0, 8.0)


@given(
    st.integers(0, 5000),
    st.floats(0.001, 100),
    st.floats(0.001, 10_000),
    st.floats(0, 1),
)
def test_backoff_within_half_cap_and_cap(attempt, base, cap, r):
    cap_n = min(cap, base * 2.0 ** min(attempt, 1023))
    wait = backoff_s(attempt, base, cap, rand=lambda: r)
    assert cap_n / 2 <= wait <= cap_n
    assert wait <= cap


@given(st.integers(0, 2000), st.floats(0.001, 100), st.floats(0.001, 10_000))
def test_caps_monotone(attempt, base, cap):
    assert cap_for(attempt, base, cap) <= cap_for(attempt + 1, base, cap) <= cap


@given(st.integers(0, 30))
def test_default_random_within_bounds(attempt):
    cap_n = cap_for(attempt)
    assert cap_n / 2 <= backoff_s(attempt) <= cap_n


def test_retry_at():
    assert retry_at(1000.0, 2, rand=lambda: 0.0) == 1002.0
    assert retry_at(1000.0, 2, retry_after=30, rand=lambda: 1.0) == 1030.0  # lower bound honoured
    assert retry_at(1000.0, 2, retry_after=1, rand=lambda: 1.0) == 1004.0  # backoff longer
    assert retry_at(1000.0, 2, retry_after=-5, rand=lambda: 0.0) == 1002.0
    assert retry_at(1000.0, 2, retry_after=math.nan, rand=lambda: 0.0) == 1002.0
    assert retry_at(1000.0, 1, retry_after=3600, rand=lambda: 0.0) == 4600.0  # may exceed the cap


@given(st.floats(0, 4e9), st.integers(0, 100), st.none() | st.floats(0, 1e6))
def test_retry_at_after_now_and_after_retry_after(now, attempt, retry_after):
    at = retry_at(now, attempt, retry_after)
    assert at > now
    if retry_after is not None:
        assert at >= now + retry_after


def test_parse_retry_after():
    now = datetime(2024, 5, 1, 12, 0, 0, tzinfo=timezone.utc).timestamp()
    assert parse_retry_after("120", now) == 120.0
    assert parse_retry_after(" 5 ", now) == 5.0
    later = format_datetime(datetime(2024, 5, 1, 12, 1, 30, tzinfo=timezone.utc), usegmt=True)
    assert parse_retry_after(later, now) == 90.0
    earlier = format_datetime(datetime(2024, 5, 1, 11, 0, tzinfo=timezone.utc), usegmt=True)
    assert parse_retry_after(earlier, now) == 0.0
    for bad in (None, "", "soon", "-3", "1.5", "Mon, 99 Foo 2024"):
        assert parse_retry_after(bad, now) is None
