"""The guard: seed 000's Lua GUARD as a pure function over in-memory state.

Rule, in this order: a dedup entry younger than the window → ``DUPLICATE``; else the
user's count for this category today at or over the daily limit → ``OVER_LIMIT``
(no limit = exempt); else ``PASS``, after which the caller records the dedup entry
(first seen = now) and increments today's counter. "Today" is the calendar day in the
user's zone; counters may be dropped two days after their day (seed: 2 × 86400 s).

Sliding windows (seed 002's two-level per-user cap, ``rate_windows`` of a
category: e.g. at most 1 per 10 minutes and 3 per hour): the send times of the
user's notifications of the category, the seed's ZSET, kept exactly as far as
any window can need them (:func:`window_refused`, :func:`window_after`).
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from hashlib import blake2b
from typing import Any, Mapping, Optional

import orjson

from .quiet_hours import load_zone

__all__ = [
    "PASS",
    "DUPLICATE",
    "OVER_LIMIT",
    "COUNTER_TTL_S",
    "check",
    "is_duplicate",
    "day_key",
    "counter_key",
    "dedup_key",
    "window_key",
    "window_refused",
    "window_after",
    "window_expired",
]

PASS = "PASS"
DUPLICATE = "DUPLICATE"
OVER_LIMIT = "OVER_LIMIT"
#: How long a daily counter must be kept (seed 000: ARGV[3] = 2 * 86400).
COUNTER_TTL_S = 2 * 86400


def is_duplicate(dedup_seen_at: Optional[float], now: float, dedup_window_s: float) -> bool:
    """True when an entry was seen less than ``dedup_window_s`` seconds ago (Redis
    ``SET … EX window`` semantics: gone exactly at the window's end). An entry stamped
    in the future (clock skew) counts as seen."""
    return dedup_seen_at is not None and now - dedup_seen_at < dedup_window_s


def dedup_expired(entry: Any, now: float, windows: Mapping[str, float]) -> bool:
    """True once a dedup table entry ``[seen_at, offset, category]`` is past its
    category's window (the window in force now), so the purge may drop it. Entries
    written before the category was stored (``[seen_at, offset]``) or of a category
    no longer configured wait for the longest window."""
    category = entry[2] if len(entry) > 2 else None
    window = windows.get(category) if category is not None else None
    if window is None:
        window = max(windows.values(), default=0)
    return now - entry[0] >= window


def check(
    dedup_seen_at: Optional[float],
    now: float,
    dedup_window_s: float,
    count_today: int,
    daily_limit: Optional[int],
) -> str:
    """``"PASS"``, ``"DUPLICATE"`` or ``"OVER_LIMIT"``, dedup first (seed 000 order)."""
    if is_duplicate(dedup_seen_at, now, dedup_window_s):
        return DUPLICATE
    if daily_limit is not None and count_today >= daily_limit:
        return OVER_LIMIT
    return PASS


def day_key(user_tz: Optional[str], now: float) -> str:
    """``"YYYY-MM-DD"``: the calendar day of ``now`` in the user's zone (UTC when the
    zone is missing or not an IANA name)."""
    try:
        zone: Any = load_zone(user_tz) if user_tz else timezone.utc
    except ValueError:
        zone = timezone.utc
    if not math.isfinite(now):
        now = 0.0
    return datetime.fromtimestamp(now, zone).date().isoformat()


def counter_key(user_id: str, category: str, day: str) -> str:
    """Key of the daily counter (seed 000's ``notify:freq:{user}:category:date`` without
    the prefix). Category names and days hold no ``:``, so the key splits from the right."""
    return f"freq:{user_id}:{category}:{day}"


def dedup_key(user_id: str, template: str, params: Mapping[str, Any] | None) -> str:
    """Key of the dedup entry: same user, same template and same params (key order
    ignored) is the same content."""
    try:
        blob = orjson.dumps(params or {}, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    except TypeError:
        blob = repr(sorted((str(k), repr(v)) for k, v in (params or {}).items())).encode()
    digest = blake2b(blob, digest_size=10).hexdigest()
    return f"dedup:{user_id}:{template}:{digest}"


def window_key(user_id: str, category: str) -> str:
    return f"{user_id}|{category}"


def window_refused(times: list[float], now: float, windows: tuple[tuple[int, int], ...]) -> bool:
    """Whether one more notification now would exceed a window: ``(seconds, n)``
    refuses when ``n`` sends are already in ``(now - seconds, now]`` (the seed:
    ZREMRANGEBYSCORE 0 (now - seconds), then ZCARD ≥ n)."""
    return any(sum(1 for t in times if now - w < t <= now) >= n for w, n in windows)


def window_after(times: list[float], now: float, windows: tuple[tuple[int, int], ...]) -> list[float]:
    """The send times to keep once ``now`` is sent: those inside the longest
    window, at most the largest ``n`` of them (the newest). Exact: for every
    window ``(w, n)``, whether ``n`` sends fall inside it is decided by the
    newest ``n`` sends, and those are kept."""
    longest = max(w for w, _n in windows)
    most = max(n for _w, n in windows)
    kept = sorted(t for t in (*times, now) if t > now - longest)
    return kept[-most:] if most else []


def window_expired(times: Any, now: float, longest_s: float) -> bool:
    """Whether a window entry can be dropped: none of its times is inside the
    longest window any more (or it is not a list of times)."""
    if not isinstance(times, list):
        return True
    return not any(isinstance(t, (int, float)) and t > now - longest_s for t in times)
