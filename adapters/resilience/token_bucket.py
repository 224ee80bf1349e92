"""Token bucket: ``rate`` tokens per second, at most ``burst`` stored.

Over any interval of length ``T`` a bucket grants at most ``burst + rate * T``
tokens, which is how a provider's "N messages per second" limit is kept.
``try_acquire`` never sleeps: it answers ``(True, 0.0)`` and takes the tokens,
or ``(False, wait_s)`` with the time after which the same request would
succeed, so an agent can re-schedule the delivery (``notify.retry`` with
``due_at = now + wait_s``) instead of blocking its partition. ``reserve`` takes
a place in line for a token due within a short wait (a lane's delivery waiting
in its own slot).

Sharing one bucket across workers
---------------------------------
A per-process bucket divides the provider's limit by the number of workers
only if traffic is even. To share one limit exactly, keep the bucket in Redis
and update it atomically with :data:`REDIS_TOKEN_BUCKET` (one round trip per
decision; the script reads the server's clock with ``TIME``, so worker clocks
do not matter)::

    ok, wait_ms = await redis.eval(REDIS_TOKEN_BUCKET, 1, "notify:bucket:{twilio}",
                                   rate, burst, n)

or :func:`redis_try_acquire` which wraps it. Use a hash tag per provider
(``{twilio}``) so Redis Cluster keeps each bucket on one slot. For high rates,
take tokens in batches (``n = 10``) and spend them locally, to save round trips.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

__all__ = ["TokenBucket", "REDIS_TOKEN_BUCKET", "redis_try_acquire"]


class TokenBucket:
    def __init__(
        self,
        rate: float,
        burst: float,
        now: Callable[[], float] = time.monotonic,
        *,
        initial: float | None = None,
    ) -> None:
        if rate <= 0 or burst <= 0:
            raise ValueError("rate and burst must be > 0")
        self.rate = float(rate)
        self.burst = float(burst)
        self._now = now
        self._tokens = self.burst if initial is None else min(self.burst, max(0.0, float(initial)))
        self._last = now()

    def _refill(self) -> None:
        t = self._now()
        if t > self._last:  # a clock that steps back grants nothing
            self._tokens = min(self.burst, self._tokens + (t - self._last) * self.rate)
            self._last = t

    @property
    def tokens(self) -> float:
        self._refill()
        return self._tokens

    def try_acquire(self, n: float = 1) -> tuple[bool, float]:
        """Take ``n`` tokens if available → ``(True, 0.0)``; else ``(False, wait_s)``
        (``wait_s = inf`` if ``n`` exceeds the burst: it can never succeed)."""
        if n <= 0:
            return True, 0.0
        if n > self.burst:
            return False, math.inf
        self._refill()
        if self._tokens >= n:
            self._tokens -= n
            return True, 0.0
        return False, (n - self._tokens) / self.rate

    def due(self) -> float:
        """Seconds until one token is there for a new caller (0.0: now)."""
        self._refill()
        return max(0.0, (1.0 - self._tokens) / self.rate)

    def reserve(self, most_wait: float) -> float | None:
        """Take a token now or in line: the seconds until it is this caller's (0.0:
        now). A token not there yet is owed (the bucket goes below zero), so the next
        caller's comes one token later: callers waiting for a burst to pass are
        served in the order they came, each woken once, instead of all polling for
        every token. None (nothing taken) when the wait would exceed ``most_wait``."""
        wait = self.due()
        if wait > most_wait:
            return None
        self._tokens -= 1.0
        return wait

    def give_back(self) -> None:
        """Return a token taken and not spent (a reserved call not made)."""
        self._refill()
        self._tokens = min(self.burst, self._tokens + 1.0)

    def set_rate(self, rate: float, burst: float | None = None) -> None:
        """Change the limit (e.g. slow down after a provider's 429s)."""
        self._refill()
        if rate <= 0:
            raise ValueError("rate must be > 0")
        self.rate = float(rate)
        if burst is not None:
            self.burst = float(burst)
            self._tokens = min(self._tokens, self.burst)

    def __repr__(self) -> str:
        return f"<TokenBucket rate={self.rate} burst={self.burst} tokens={self._tokens:.3f}>"


#: KEYS[1] = bucket hash; ARGV = rate (tokens/s), burst, n → {ok 1|0, wait_ms}
REDIS_TOKEN_BUCKET = """
if redis.replicate_commands then pcall(redis.replicate_commands) end
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local b = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(b[1])
local ts = tonumber(b[2])
if tokens == nil or ts == nil then
  tokens = burst
  ts = now
end
if now > ts then
  tokens = math.min(burst, tokens + (now - ts) * rate / 1000)
  ts = now
end
local ok = 0
local wait = 0
if n > burst then
  wait = -1
elseif tokens >= n then
  tokens = tokens - n
  ok = 1
else
  wait = math.ceil((n - tokens) * 1000 / rate)
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(ts))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst * 1000 / rate) + 1000)
return {ok, wait}
"""


async def redis_try_acquire(redis: Any, key: str, rate: float, burst: float, n: int = 1) -> tuple[bool, float]:
    """Shared-bucket ``try_acquire`` through :data:`REDIS_TOKEN_BUCKET`
    (``redis``: a ``redis.asyncio.Redis``) → ``(ok, wait_s)``."""
    ok, wait_ms = await redis.eval(REDIS_TOKEN_BUCKET, 1, key, rate, burst, n)
    wait_ms = int(wait_ms)
    return bool(int(ok)), (math.inf if wait_ms < 0 else wait_ms / 1000.0)
