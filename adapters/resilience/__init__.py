"""Pure resilience logic for the channel agents: token bucket, circuit breaker,
failover policy. No I/O and no sleeping; every class takes an injectable clock
(``now: Callable[[], float]``, monotonic seconds) so tests run on a fake clock."""

from .breaker import CircuitBreaker, counts_as_success
from .failover import BREAKER_OPEN, choose_provider, may_failover
from .token_bucket import REDIS_TOKEN_BUCKET, TokenBucket, redis_try_acquire

__all__ = [
    "TokenBucket",
    "REDIS_TOKEN_BUCKET",
    "redis_try_acquire",
    "CircuitBreaker",
    "counts_as_success",
    "choose_provider",
    "may_failover",
    "BREAKER_OPEN",
]
