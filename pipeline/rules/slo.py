"""Seed 001's service level: "99.9% of legal events terminal within 60 s of
acceptance", as pure functions over what the record store keeps.

An *event* is one producer's business key: its notifications (every recipient,
every channel) are terminal when each record reached a terminal state
(``FILTERED``, ``ACCEPTED``, ``DELIVERED``, ``UNDELIVERED``, ``FAILED``,
``REVIEW``; ``ACCEPTED`` is terminal for the pipeline, a receipt may still
follow). Its latency is the slowest record's acceptance → first terminal state.
Events that were deferred on purpose (quiet hours, ``send_at``) are not held to
the goal: they are reported apart, per category, as their own distribution.
Events rejected at the door (dead-lettered) never reach the store: "legal".
"""

from __future__ import annotations

import calendar
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Iterable, Optional

from pipeline.models import State

__all__ = ["EventRow", "summarize", "parse_time", "month_range", "first_terminal", "GOAL_S", "TARGET"]

#: seed 001: terminal within 60 s of acceptance …
GOAL_S = 60.0
#: … for 99.9% of legal events
TARGET = 0.999

_RECEIPT_STATES = (State.DELIVERED, State.UNDELIVERED)
_LAST = 1e10 - 1  # 2286-11-20


@dataclass(frozen=True, slots=True)
class EventRow:
    """One event as the store aggregates it."""

    priority: str
    category: str
    accepted_at: float
    #: the slowest record's acceptance → terminal, ms; None while any is not terminal
    latency_ms: Optional[float]
    #: some record was deferred (quiet hours, send_at)
    deferred: bool


def first_terminal(o: Any) -> bool:
    """Whether outcome ``o`` is its delivery's first terminal state (observed once
    for the acceptance → terminal histogram): a terminal state taken by the
    pipeline, not a receipt after ``ACCEPTED`` nor the report of a repeated
    request (``FILTERED duplicate``)."""
    if o.state not in State.TERMINAL or o.reason == "duplicate":
        return False
    receipt = o.state in _RECEIPT_STATES and o.attempt is None and o.reason != "in_inbox"
    return not receipt


def _pct(sorted_ms: list[float], q: float) -> Optional[float]:
    if not sorted_ms:
        return None
    i = min(len(sorted_ms) - 1, max(0, math.ceil(q * len(sorted_ms)) - 1))
    return round(sorted_ms[i], 1)


def _summary(rows: list[EventRow], goal_ms: float, now: float) -> dict[str, Any]:
    done = sorted(r.latency_ms for r in rows if r.latency_ms is not None)
    within = sum(1 for ms in done if ms <= goal_ms)
    # an event still open past the goal has missed it; one still open inside it is not judged yet
    late_open = sum(1 for r in rows if r.latency_ms is None and (now - r.accepted_at) * 1000.0 > goal_ms)
    judged = len(done) + late_open
    return {
        "events": len(rows),
        "terminal": len(done),
        "within_goal": within,
        "open_past_goal": late_open,
        "open_in_goal": len(rows) - judged,
        "ratio": round(within / judged, 6) if judged else None,
        "p50_ms": _pct(done, 0.50),
        "p99_ms": _pct(done, 0.99),
        "p999_ms": _pct(done, 0.999),
        "max_ms": round(done[-1], 1) if done else None,
    }


def summarize(rows: Iterable[EventRow], since: float, until: float, now: float,
              goal_s: float = GOAL_S, target: float = TARGET) -> dict[str, Any]:
    """The report for events accepted in ``[since, until)``: overall and per
    priority (``met``: the ratio reaches ``target``, or nothing was judged),
    and deferred events apart per category."""
    goal_ms = goal_s * 1000.0
    held, deferred = [], []
    for r in rows:
        (deferred if r.deferred else held).append(r)
    overall = _summary(held, goal_ms, now)
    by_priority = {}
    for p in sorted({r.priority for r in held}):
        by_priority[p] = _summary([r for r in held if r.priority == p], goal_ms, now)
    apart = {c: _summary([r for r in deferred if r.category == c], goal_ms, now)
             for c in sorted({r.category for r in deferred})}
    for s in (overall, *by_priority.values()):
        s["met"] = s["ratio"] is None or s["ratio"] >= target
    return {
        "since": since,
        "until": until,
        "goal_s": goal_s,
        "target": target,
        "met": overall["met"],
        "all": overall,
        "priorities": by_priority,
        "deferred": apart,
    }


def parse_time(text: str) -> float:
    """Unix seconds, or an ISO 8601 date / date-time (UTC unless it says otherwise),
    held to [1970, 2286): a report's bound outside it selects the same records.
    ``ValueError`` otherwise."""
    text = text.strip()
    try:
        value = float(text)
    except ValueError:
        try:
            dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"{text[:40]!r} is not unix seconds nor an ISO 8601 date or time") from None
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=timezone.utc)
        value = dt.timestamp()
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]!r} is not a time")
    return min(max(value, 0.0), _LAST)


def month_range(month: Optional[str], now: float) -> tuple[float, float]:
    """``YYYY-MM`` (default: the month of ``now``, UTC) → [first second, next month's first)."""
    if month:
        try:
            year, mon = (int(x) for x in month.split("-", 1))
            if not 1 <= mon <= 12 or not 1970 <= year < 2286:
                raise ValueError
        except ValueError:
            raise ValueError(f"{month[:20]!r} is not a month (YYYY-MM)") from None
    else:
        t = datetime.fromtimestamp(now, timezone.utc)
        year, mon = t.year, t.month
    start = calendar.timegm((year, mon, 1, 0, 0, 0))
    nyear, nmon = (year + 1, 1) if mon == 12 else (year, mon + 1)
    return float(start), float(calendar.timegm((nyear, nmon, 1, 0, 0, 0)))
