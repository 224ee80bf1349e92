"""The scaling signal (pipeline/rules/scaling.py) and its metrics over a real
Redis lag snapshot."""

import math

from hypothesis import given
from hypothesis import strategies as st

from pipeline.rules.scaling import GOALS, priority_of, signal


def test_priorities_of_topics():
    assert priority_of("notify.send.sms.high") == "high"
    assert priority_of("notify.intents.low") == "low"
    assert priority_of("notify.events.high") == "high" and priority_of("notify.timers.high") == "high"
    assert priority_of("notify.timers") is None
    assert priority_of("notify.events") is None and priority_of("notify.outcomes") is None


def test_needed_workers_from_the_drain_rate():
    # 2 workers drain 100/s; 30,000 behind: 300 s to drain, the goal is 60 s: 10 workers
    s = signal("normal", 2, [(20_000, 40.0, 60.0), (10_000, 10.0, 40.0)])
    assert (s.lag, s.time_to_drain_s, s.needed, s.oldest_age_s) == (30_000, 300.0, 10, 40.0)
    assert signal("normal", 2, [(100, 1.0, 100.0)]).needed == 1  # 1 s of work: one is enough
    assert signal("high", 1, []).needed == 1 and signal("high", 1, []).time_to_drain_s == 0.0
    # not draining: the rate cannot say; one more when the oldest is past the goal
    assert signal("low", 3, [(50, 61.0, 0.0)]).needed == 4
    assert signal("low", 3, [(50, 10.0, None)]).needed == 3 and signal("low", 3, [(50, 10.0, None)]).rate is None


@given(st.sampled_from(sorted(GOALS)), st.integers(1, 64),
       st.lists(st.tuples(st.integers(0, 10**7), st.floats(0, 1e4), st.floats(0.001, 1e5)), min_size=1, max_size=8))
def test_the_needed_workers_drain_the_backlog_within_the_goal(priority, workers, lags):
    s = signal(priority, workers, lags)
    per_worker = sum(r for _n, _a, r in lags) / workers
    assert s.needed >= 1
    # the needed workers, at the measured rate per worker, drain it within the goal, and one fewer would not
    assert s.lag <= s.needed * per_worker * s.goal_s * (1 + 1e-6) or s.lag == 0
    if s.needed > 1:
        assert s.lag > (s.needed - 1) * per_worker * s.goal_s * (1 - 1e-6)
    assert math.isfinite(s.time_to_drain_s)
