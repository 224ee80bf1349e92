"""Quiet hours: whether a notification waits until the user's quiet window ends.

Rule: a window ``"HH:MM-HH:MM"`` is read on the wall clock of the user's IANA zone;
start is inside, end is outside; a window whose end is earlier than its start crosses
midnight (``"22:00-07:00"``). High priority goes through; normal and low wait until the
window ends. Across DST the end is the first instant the wall clock shows the end time
(or later, when a spring-forward gap skips it). A bad zone or window stored in
preferences means no quiet hours (``parse_quiet_hours`` rejects them on update).
"""

from __future__ import annotations

import math
import re
from datetime import date, datetime, time, timedelta, timezone
from typing import Any, Optional
from zoneinfo import ZoneInfo

__all__ = ["parse_quiet_hours", "load_zone", "in_window", "quiet_until", "defer_decision", "channel_windows",
           "quiet_until_any", "channel_quiet_ends"]

#: spaces around the parts are allowed, nothing else: no tab, no line break (``\s``
#: and ``$`` would let "22:00-07:00\n" through); ASCII digits only (``\d`` is any
#: Unicode digit); matched whole (``fullmatch``)
_WINDOW_RE = re.compile(r" *([01][0-9]|2[0-3]):([0-5][0-9]) *- *([01][0-9]|2[0-3]):([0-5][0-9]) *")


def parse_quiet_hours(value: str) -> tuple[int, int]:
    """``"22:00-07:00"`` → (start, end) in minutes after midnight; ValueError when the
    format is wrong or the window is empty (start == end)."""
    if not isinstance(value, str):
        raise ValueError(f"quiet hours must be a string like '22:00-07:00', got {value!r}")
    m = _WINDOW_RE.fullmatch(value)
    if not m:
        raise ValueError(f"quiet hours must look like 'HH:MM-HH:MM' (00:00–23:59), got {value!r}")
    start = int(m.group(1)) * 60 + int(m.group(2))
    end = int(m.group(3)) * 60 + int(m.group(4))
    if start == end:
        raise ValueError(f"quiet hours window is empty: {value!r}")
    return start, end


def load_zone(tz: str) -> ZoneInfo:
    """ZoneInfo for an IANA name; ValueError for anything that is not one."""
    if not isinstance(tz, str) or not tz or tz.startswith(("/", ".")) or ".." in tz:
        raise ValueError(f"not an IANA time zone: {tz!r}")
    try:
        return ZoneInfo(tz)
    except Exception:  # ZoneInfoNotFoundError, ValueError, IsADirectoryError, …
        raise ValueError(f"not an IANA time zone: {tz!r}") from None


def in_window(start: int, end: int, local: datetime) -> bool:
    """Whether the wall time ``local`` falls in [start, end) (minutes; may cross midnight)."""
    t = local.hour * 60 + local.minute + (local.second + local.microsecond / 1e6) / 60
    if start < end:
        return start <= t < end
    return t >= start or t < end


def quiet_until(prefs_quiet_hours: Optional[str], tz: str, now: float) -> Optional[float]:
    """The unix time the user's quiet window ends if ``now`` is inside it, else None."""
    if not prefs_quiet_hours:
        return None
    try:
        start, end = parse_quiet_hours(prefs_quiet_hours)
        zone = load_zone(tz)
        local = datetime.fromtimestamp(now, zone)
    except (ValueError, OverflowError, OSError):
        return None
    if not in_window(start, end, local):
        return None
    until = now
    # At most a few rounds: only a DST gap swallowing the window's end needs a second.
    for _ in range(4):
        end_time = time(end // 60, end % 60)
        day = local.date()
        if start > end and local.hour * 60 + local.minute >= start:
            day += timedelta(days=1)  # in the evening part of a window crossing midnight
        until = _first_instant_at_or_after(day, end_time, zone, until)
        local = datetime.fromtimestamp(until, zone)
        if not in_window(start, end, local):
            break
    return until


def _first_instant_at_or_after(day: date, wall: time, zone: ZoneInfo, now: float) -> float:
    """The first instant after ``now`` whose wall clock in ``zone`` reads ``day wall``
    or later. Handles ambiguous (fall back: the occurrence after now) and skipped
    (spring forward: the moment the clock jumps past it) wall times."""
    naive = datetime.combine(day, wall)
    candidates = sorted({naive.replace(tzinfo=zone, fold=f).timestamp() for f in (0, 1)})
    for ts in candidates:
        if ts > now and _wall(ts, zone) == naive:
            return ts
    # Skipped wall time: bisect (whole seconds) for the moment the clock jumps past it.
    lo, hi = math.floor(now), math.ceil(candidates[-1])
    if hi <= now or _wall(hi, zone) < naive:  # cannot happen for a real zone; stay safe
        return max(candidates[-1], now + 1.0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _wall(mid, zone) >= naive:
            hi = mid
        else:
            lo = mid
    return float(hi)


def _wall(ts: float, zone: ZoneInfo) -> datetime:
    return datetime.fromtimestamp(ts, timezone.utc).astimezone(zone).replace(tzinfo=None)


def defer_decision(priority: str, prefs_quiet_hours: Optional[str], tz: str, now: float) -> Optional[float]:
    """None = send now; otherwise the unix time to hold the notification until.
    ``high`` always goes now; ``normal``, ``low`` (and anything else) wait out quiet hours."""
    if priority == "high":
        return None
    return quiet_until(prefs_quiet_hours, tz, now)


def channel_windows(prefs: Any, channel: str) -> list[str]:
    """The quiet windows of one channel (seed: quiet hours per channel): its own
    list when the user set one (``[]``: never quiet), else the user's window."""
    own = getattr(prefs, "channel_quiet_hours", None) or {}
    if channel in own:
        return list(own[channel] or [])
    default = getattr(prefs, "quiet_hours", None)
    return [default] if default else []


def quiet_until_any(windows: list[str], tz: str, now: float) -> Optional[float]:
    """When ``now`` is inside any of ``windows``: the first instant outside all of
    them (windows that overlap or touch are waited out one after the other), else None."""
    t = now
    for _ in range(2 * len(windows) + 2):
        ends = [e for e in (quiet_until(w, tz, t) for w in windows) if e is not None]
        if not ends:
            break
        t = max(ends)
    return t if t > now else None


def channel_quiet_ends(priority: str, prefs: Any, channels: list[str], now: float) -> dict[str, Optional[float]]:
    """Per channel, when its quiet hours end (None: not quiet now). ``high`` always goes now."""
    if priority == "high" or prefs is None:
        return {c: None for c in channels}
    tz = getattr(prefs, "tz", "UTC") or "UTC"
    return {c: quiet_until_any(channel_windows(prefs, c), tz, now) for c in channels}
