"""Retry timing: seed 000's exponential backoff with jitter, and Retry-After.

Rule: before retry number ``attempt`` wait a uniform time in [cap_n / 2, cap_n] where
cap_n = min(cap, base · 2^attempt) (base 1 s, cap 10 min), so retries spread out
instead of arriving together. A provider's Retry-After is a lower bound, never
shortened by the jitter (it says when to try again; it does not prove anything about
the earlier request).
"""

from __future__ import annotations

import math
import random
from email.utils import parsedate_to_datetime
from typing import Callable, Optional

__all__ = ["BASE_S", "CAP_S", "cap_for", "backoff_s", "retry_at", "parse_retry_after"]

BASE_S = 1.0
CAP_S = 600.0


def cap_for(attempt: int, base: float = BASE_S, cap: float = CAP_S) -> float:
    """cap_n = min(cap, base · 2^attempt); ``attempt`` < 0 is an error."""
    if attempt < 0:
        raise ValueError(f"attempt must be ≥ 0, got {attempt}")
    if attempt >= 1024:  # 2.0 ** attempt would overflow; the cap has long won
        return cap
    return min(cap, base * 2.0**attempt)


def backoff_s(
    attempt: int,
    base: float = BASE_S,
    cap: float = CAP_S,
    rand: Callable[[], float] = random.random,
) -> float:
    """Seconds to wait before retry ``attempt``: in [cap_n / 2, cap_n]."""
    cap_n = cap_for(attempt, base, cap)
    r = min(1.0, max(0.0, float(rand())))  # clamp a bad random source (NaN → 0)
    return cap_n / 2 + r * (cap_n / 2)


def retry_at(
    now: float,
    attempt: int,
    retry_after: Optional[float] = None,
    base: float = BASE_S,
    cap: float = CAP_S,
    rand: Callable[[], float] = random.random,
) -> float:
    """The unix time of the next try: now + the larger of the backoff and a
    provider's ``retry_after`` (seconds; None, negative or NaN is ignored)."""
    wait = backoff_s(attempt, base, cap, rand)
    if retry_after is not None and math.isfinite(retry_after) and retry_after > wait:
        wait = retry_after
    return now + wait


def parse_retry_after(header: Optional[str], now: float) -> Optional[float]:
    """An HTTP Retry-After value (delta-seconds or an HTTP-date, RFC 9110 §10.2.3) as
    seconds from ``now``; None when absent or unreadable. Never negative."""
    if header is None:
        return None
    value = str(header).strip()
    if not value:
        return None
    if value.isdigit():
        return float(int(value))
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when is None or when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - now)
