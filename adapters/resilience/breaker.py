"""Circuit breaker, one per provider.

States: ``closed`` (calls flow) → ``open`` after ``failure_threshold``
consecutive failures, or when the failure ratio over the last ``window_s``
seconds reaches ``failure_ratio`` with at least ``min_calls`` calls → after
``reset_timeout`` seconds ``half_open``: up to ``half_open_max`` trial calls
are allowed; the first success closes the breaker, a failure re-opens it (and
restarts the ``reset_timeout``).

Use: ``if breaker.allow(): result = await provider.send(d);
breaker.record(counts_as_success(result))``. Every ``allow()`` that
returned True must be followed by one ``record()`` (in half-open state it
holds a trial slot). Results that arrive while the breaker is open (calls
allowed before it opened) are ignored.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable, Optional

from pipeline.models import AttemptResult

from ..base import Fault

__all__ = ["CircuitBreaker", "counts_as_success", "CLOSED", "OPEN", "HALF_OPEN"]

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"


def counts_as_success(result: Any) -> bool:
    """Which attempt results mean "the provider is healthy".

    ``result``: an ``AttemptResult`` string, or anything with ``.result`` and
    ``.fault`` (a ``SendResult``). ACCEPTED and PERMANENT_ERROR (the provider
    answered; the recipient was bad) are successes; TRANSIENT_ERROR,
    TIMEOUT_UNKNOWN and RATE_LIMITED (sustained throttling is a reason to shift
    traffic) are failures. The result's ``fault`` overrides that: a fault of one
    recipient (APNs' per-device 429) or of one route (Twilio 21408) says the
    provider answered and is healthy; a fault of our configuration (wrong APNs
    topic, FCM third-party auth) counts as a failure whatever the status, so the
    breaker opens on it (only provider-wide faults count).
    """
    fault = getattr(result, "fault", None)
    if fault in (Fault.RECIPIENT, Fault.ROUTE):
        return True
    if fault == Fault.CONFIG:
        return False
    status = result if isinstance(result, str) or result is None else getattr(result, "result", None)
    return status in (AttemptResult.ACCEPTED, AttemptResult.PERMANENT_ERROR)


class CircuitBreaker:
    def __init__(
        self,
        failure_threshold: int = 5,
        reset_timeout: float = 30.0,
        half_open_max: int = 1,
        *,
        failure_ratio: Optional[float] = None,
        window_s: float = 60.0,
        min_calls: int = 20,
        now: Callable[[], float] = time.monotonic,
        name: str = "",
        on_change: Optional[Callable[[str, str, str], None]] = None,
    ) -> None:
        if failure_threshold < 1 or half_open_max < 1 or reset_timeout < 0:
            raise ValueError("failure_threshold and half_open_max must be >= 1, reset_timeout >= 0")
        self.failure_threshold = failure_threshold
        self.reset_timeout = reset_timeout
        self.half_open_max = half_open_max
        self.failure_ratio = failure_ratio
        self.window_s = window_s
        self.min_calls = min_calls
        self.name = name
        self._now = now
        self._on_change = on_change
        self._state = CLOSED
        self._consecutive = 0
        self._opened_at = 0.0
        self._trials = 0
        self._window: deque[tuple[float, bool]] = deque()
        self.opened_count = 0

    # ------------------------------------------------------------ state

    def _set(self, state: str) -> None:
        old, self._state = self._state, state
        if old != state and self._on_change is not None:
            self._on_change(self.name, old, state)

    def _tick(self) -> None:
        if self._state == OPEN and self._now() - self._opened_at >= self.reset_timeout:
            self._trials = 0
            self._set(HALF_OPEN)

    @property
    def state(self) -> str:
        """``"closed"``, ``"open"`` or ``"half_open"`` (moves open → half_open
        once ``reset_timeout`` has passed)."""
        self._tick()
        return self._state

    def retry_in(self) -> float:
        """Seconds until an open breaker half-opens (0 if not open)."""
        if self.state != OPEN:
            return 0.0
        return max(0.0, self._opened_at + self.reset_timeout - self._now())

    def _open(self) -> None:
        self._opened_at = self._now()
        self._trials = 0
        self._consecutive = 0
        self._window.clear()
        self.opened_count += 1
        self._set(OPEN)

    # ------------------------------------------------------------ calls

    def allow(self) -> bool:
        """May a call go to this provider now? (Takes a trial slot when half-open.)"""
        state = self.state
        if state == CLOSED:
            return True
        if state == HALF_OPEN and self._trials < self.half_open_max:
            self._trials += 1
            return True
        return False

    def record(self, success: bool) -> None:
        state = self.state
        if state == OPEN:
            return
        if state == HALF_OPEN:
            if success:
                self._consecutive = 0
                self._window.clear()
                self._set(CLOSED)
            else:
                self._open()
            return
        # closed
        now = self._now()
        self._consecutive = 0 if success else self._consecutive + 1
        if self.failure_ratio is not None:
            self._window.append((now, success))
            horizon = now - self.window_s
            while self._window and self._window[0][0] < horizon:
                self._window.popleft()
        if self._consecutive >= self.failure_threshold:
            self._open()
            return
        if self.failure_ratio is not None and len(self._window) >= self.min_calls:
            failures = sum(1 for _, ok in self._window if not ok)
            if failures / len(self._window) >= self.failure_ratio:
                self._open()

    def release(self) -> None:
        """Give back a half-open trial slot without a verdict (call not made)."""
        if self._state == HALF_OPEN and self._trials > 0:
            self._trials -= 1

    def __repr__(self) -> str:
        return f"<CircuitBreaker {self.name!r} {self.state} consecutive={self._consecutive}>"
