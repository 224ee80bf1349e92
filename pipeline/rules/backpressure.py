"""Backpressure (seed 001): when the pipeline falls behind, non-critical
marketing waits so that transactional and OTP traffic keeps its latency.

The signal is the age of the oldest unprocessed entry of any lane
(``notify.send.<channel>.<priority>``) or intents topic: how long the work
already accepted has been waiting. Above ``after_s`` the throttle goes on; it
goes off by itself once the age is under half of ``after_s`` (hysteresis, so it
does not flap at the edge). While it is on, a throttled category's intent is
deferred by ``retry_s`` (``SCHEDULED backpressure``) and looked at again then.
"""

from __future__ import annotations

from typing import Iterable

__all__ = ["BACKPRESSURE", "watched", "oldest_age", "throttle", "throttled"]

BACKPRESSURE = "backpressure"


def watched(topic: str) -> bool:
    """Topics whose backlog age is the signal: the lanes and the intents."""
    return topic.startswith(("notify.send.", "notify.intents."))


def oldest_age(ages: Iterable[tuple[str, float]]) -> float:
    """The oldest unprocessed entry's age over the watched topics: ``(topic, age)``."""
    return max((a for t, a in ages if watched(t)), default=0.0)


def throttle(on: bool, age_s: float, after_s: float) -> bool:
    """The throttle's next state: on above ``after_s``, off under ``after_s / 2``,
    else as it was."""
    if age_s > after_s:
        return True
    if age_s < after_s / 2:
        return False
    return on


def throttled(category: str, priority: str, on: bool, categories: Iterable[str]) -> bool:
    """Whether an intent waits: the throttle is on, its category is throttled, and
    it is not high priority (an OTP is never held)."""
    return on and priority != "high" and category in tuple(categories)
