"""The scaling signal (seed 004: scale workers by queue depth), as pure functions.

Per priority, from the lag snapshot of the topics that priority's workers read
(its intents and lanes; the high events topic for ``high``): the backlog, the
age of its oldest unprocessed entry, the drain rate, the time to drain at that
rate, and how many workers the drain rate says are needed to finish the backlog
within the priority's latency goal:

    needed = ceil(workers × time_to_drain / goal)      (at least 1)

that is, the backlog over what one worker drains in one goal. A backlog that is
not draining at all (rate 0 or not measured yet) while its oldest entry is
already older than the goal asks for one worker more than are running: the rate
cannot say how many. An autoscaler (KEDA, a Kubernetes HPA on an external
metric) reads ``notify_workers_needed{priority}``; see docs/SCALING.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Optional

__all__ = ["GOALS", "PriorityLoad", "priority_of", "signal"]

#: latency goal per priority, seconds: an OTP within 5 s (seed 000), every
#: other legal event terminal within 60 s (seed 001)
GOALS: dict[str, float] = {"high": 5.0, "normal": 60.0, "low": 60.0}


@dataclass(frozen=True, slots=True)
class PriorityLoad:
    priority: str
    workers: int
    lag: int
    oldest_age_s: float
    #: entries/s committed over the rate window (None: not measured yet)
    rate: Optional[float]
    time_to_drain_s: Optional[float]
    needed: int
    goal_s: float

    def as_dict(self) -> dict:
        return {
            "priority": self.priority,
            "workers": self.workers,
            "lag": self.lag,
            "oldest_age_s": round(self.oldest_age_s, 3),
            "rate_per_s": None if self.rate is None else round(self.rate, 2),
            "time_to_drain_s": None if self.time_to_drain_s is None else round(self.time_to_drain_s, 1),
            "goal_s": self.goal_s,
            "workers_needed": self.needed,
        }


def priority_of(topic: str) -> Optional[str]:
    """The priority whose workers read ``topic`` (None for the shared topics)."""
    if topic.startswith(("notify.send.", "notify.intents.")):
        p = topic.rsplit(".", 1)[1]
        return p if p in GOALS else None
    if topic in ("notify.events.high", "notify.timers.high"):
        return "high"
    return None


def signal(priority: str, workers: int, lags: Iterable[tuple[int, float, Optional[float]]],
           goal_s: Optional[float] = None) -> PriorityLoad:
    """``lags``: (lag, oldest age s, rate) of each topic the priority's workers read."""
    goal = GOALS.get(priority, 60.0) if goal_s is None else goal_s
    workers = max(1, workers)
    lag, age, rate, measured = 0, 0.0, 0.0, False
    for n, a, r in lags:
        lag += max(0, n)
        age = max(age, a)
        if r is not None:
            rate += r
            measured = True
    if lag == 0:
        ttd: Optional[float] = 0.0
    elif measured and rate > 0:
        ttd = lag / rate
    else:
        ttd = None
    if ttd is None:
        needed = workers + 1 if age > goal else workers
    else:
        needed = max(1, math.ceil(workers * ttd / goal - 1e-9))
    return PriorityLoad(priority, workers, lag, age, rate if measured else None, ttd, needed, goal)
