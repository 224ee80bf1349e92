"""Calling a channel's providers: per-provider token bucket and circuit breaker,
failover in order (A → B) when the last provider certainly did not take the
message, and reconciliation queries. Holds no delivery state: what to do with a
result is decided by :mod:`pipeline.rules.attempts`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from pipeline.models import AttemptResult, Delivery
from pipeline.parsers.events import address_ok

from .base import Fault, PermanentKind, Provider, QueryResult, QueryStatus, SendResult
from .resilience.breaker import CircuitBreaker, counts_as_success
from .resilience.failover import choose_provider, may_failover
from .resilience.token_bucket import TokenBucket

__all__ = ["Dispatcher", "SendRound"]

log = logging.getLogger("notify.adapters")


class _LogFaults:
    """A configuration fault logged at ERROR, once per ``every`` seconds per
    provider and error (a lane would repeat it on every call)."""

    def __init__(self, now: Callable[[], float], every: float = 60.0) -> None:
        self._now = now
        self.every = every
        self._last: dict[tuple[str, str], float] = {}

    def __call__(self, provider: str, result: SendResult) -> None:
        key = (provider, (result.error or "")[:80])
        t = self._now()
        if t - self._last.get(key, float("-inf")) >= self.every:
            self._last[key] = t
            log.error("provider %s: configuration fault, no retry will fix it: %s", provider, result.error)


@dataclass
class SendRound:
    """What one lane step did: the provider calls made (in order), or why none was."""

    results: list[SendResult] = field(default_factory=list)
    #: no call possible now (breakers open, or out of rate): try again after this many seconds
    wait_s: Optional[float] = None


def _same_failure(before: list[SendResult], result: SendResult) -> bool:
    """``result`` (a failure) is a failover's, and the previous provider failed this
    message with the same result, neither a fault of our configuration."""
    if not before:
        return False
    last = before[-1]
    return last.result == result.result and last.fault != Fault.CONFIG and result.fault != Fault.CONFIG


class Dispatcher:
    def __init__(
        self,
        providers: Mapping[str, Provider],
        routes: Mapping[str, Sequence[str]],
        *,
        rates: Optional[Mapping[str, tuple[float, float]]] = None,
        breaker: Optional[Mapping[str, Any]] = None,
        now: Callable[[], float] = time.monotonic,
        on_breaker_change: Optional[Callable[[str, str, str], None]] = None,
        on_fault: Optional[Callable[[str, SendResult], None]] = None,
    ) -> None:
        """``on_fault(provider, result)`` is called for every result that is a
        fault of our configuration (``result.fault == Fault.CONFIG``: a wrong
        APNs topic, FCM's third-party credentials): an alert (a metric), since
        no retry fixes it. Such faults are also logged at ERROR, once a minute
        per provider and error."""
        self.providers = dict(providers)
        self.on_fault = on_fault
        self._log_fault = _LogFaults(now)
        self.routes = {c: list(names) for c, names in routes.items()}
        self.breakers = {
            n: CircuitBreaker(name=n, now=now, on_change=on_breaker_change, **(breaker or {})) for n in self.providers
        }
        self.buckets = {n: TokenBucket(r, b, now) for n, (r, b) in (rates or {}).items()}

    async def send(self, delivery: Delivery, *, reconciled: bool = False, deadline: Optional[float] = None,
                   most_wait: float = 0.0) -> SendRound:
        """Call providers for ``delivery`` until one takes it, answers in a way that
        forbids failover, or none is left to try (a provider out of rate is passed
        over for the next one of the route with a token); with ``deadline`` (seconds), a call
        to a provider with a status query that has not answered by then is given up
        as ``TIMEOUT_UNKNOWN`` (:meth:`_call`)."""
        # push: the token's platform ("apns:<token>", "fcm:<token>") picks the provider
        order = self._order(delivery)
        rnd = SendRound()
        if not address_ok(delivery.channel, delivery.address or ""):
            # the same check as at the door (pipeline/parsers/events.py): an address that
            # fails it (stored before the check was tightened, written straight to a
            # topic) is refused here, before any provider sees it, and for good: no
            # retry or failover makes it an address
            name = order[0] if order else delivery.channel
            rnd.results.append(SendResult(AttemptResult.PERMANENT_ERROR, name, permanent_kind=PermanentKind.BAD_ADDRESS,
                                          error=f"bad_address: not an address for {delivery.channel}"))
            return rnd
        tried: list[str] = []
        #: providers out of rate for this round, and the soonest any of them has a token
        out_of_rate: list[str] = []
        rate_wait: Optional[float] = None
        while True:
            name = choose_provider(order, self.breakers, delivery, reconciled=reconciled, avoid=tried + out_of_rate)
            if name is None or name in tried or name in out_of_rate:
                if name is not None:
                    self.breakers[name].release()
                waits = not rnd.results and out_of_rate and most_wait > 0
                name = await self._in_line(out_of_rate, most_wait) if waits else None
                if name is None:
                    if not rnd.results:
                        rnd.wait_s = rate_wait if rate_wait is not None else self._soonest_breaker()
                    return rnd
                out_of_rate.remove(name)  # its token is ours: called below
            else:
                bucket = self.buckets.get(name)
                if bucket is not None:
                    ok, wait = bucket.try_acquire()
                    if not ok:
                        # out of rate: the next provider of the route that has a token takes it
                        # (a burst of OTPs spills over to the second SMS vendor instead of
                        # queueing behind the first one's quota); none: wait in line for the
                        # soonest (``most_wait``), or say when it has one
                        self.breakers[name].release()
                        out_of_rate.append(name)
                        rate_wait = wait if rate_wait is None else min(rate_wait, wait)
                        continue
            result = await self._call(self.providers[name], delivery, deadline)
            healthy = counts_as_success(result)
            if not healthy and _same_failure(rnd.results, result):
                # failed over, and failed here the way it failed at the provider before:
                # the message, more likely than this provider (a second vendor sees
                # mostly the failovers, so mostly the messages that fail everywhere: five
                # of those in a burst opened its breaker and shut its quota out). Not
                # held against this provider; what it takes first-hand still counts
                self.breakers[name].release()
            else:
                self.breakers[name].record(healthy)
            if result.fault == Fault.CONFIG:
                self._log_fault(name, result)
                if self.on_fault is not None:
                    self.on_fault(name, result)
            rnd.results.append(result)
            tried.append(name)
            if not may_failover(result) or delivery.unknown_provider:
                return rnd

    async def _in_line(self, names: list[str], most_wait: float) -> Optional[str]:
        """Every provider of the route left is out of rate: take a place in line for
        the token that comes soonest (``TokenBucket.reserve``), if within
        ``most_wait`` seconds, and wait for it; the provider, its breaker's call
        allowed, or None (none within ``most_wait``, or its breaker opened
        meanwhile: the token is given back)."""
        name = min(names, key=lambda n: self.buckets[n].due())
        bucket = self.buckets[name]
        wait = bucket.reserve(most_wait)
        if wait is None:
            return None
        if wait > 0:
            await asyncio.sleep(wait)
        if not self.breakers[name].allow():
            bucket.give_back()
            return None
        return name

    @staticmethod
    async def _call(provider: Any, delivery: Delivery, deadline: Optional[float]) -> SendResult:
        """``provider.send(delivery)``, given up after ``deadline`` seconds when the
        provider can be asked afterwards whether it took the message (``status_query``):
        then it is ``TIMEOUT_UNKNOWN``, reconciled by that query before any resend, as an
        adapter's own read timeout is. A provider without a query keeps its adapter's
        timeout: a deadline would turn its slow successes into REVIEW."""
        if deadline is None or not provider.status_query:
            return await provider.send(delivery)
        started = time.monotonic()
        try:
            async with asyncio.timeout(deadline):
                return await provider.send(delivery)
        except TimeoutError:
            return SendResult(AttemptResult.TIMEOUT_UNKNOWN, provider.name,
                              error=f"deadline: no answer within {deadline:g}s",
                              latency_ms=(time.monotonic() - started) * 1000.0)

    def _order(self, delivery: Delivery) -> list[str]:
        order = self.routes.get(delivery.channel, [])
        # the platform is the provider's kind when the config named it otherwise
        # ("apns_prod": its ``platform`` is "apns", adapters/registry.py)
        return [n for n in order
                if (delivery.address or "").startswith((getattr(self.providers.get(n), "platform", None) or n) + ":")
                ] or order

    async def query(self, delivery: Delivery) -> QueryResult:
        """Ask the provider that timed out (``unknown_provider``) or, when a call's
        fate is unknown after a crash, every provider of the route."""
        names = [delivery.unknown_provider] if delivery.unknown_provider else self._order(delivery)
        answers = []
        for name in names:
            provider = self.providers.get(name)
            if provider is None:  # pinned to a provider this worker does not have: nobody to ask (→ REVIEW)
                answers.append(QueryResult(False, status=QueryStatus.NOT_FOUND, supported=False, provider=name))
                continue
            q = await provider.query(delivery.delivery_id, delivery.provider_msg_id)
            q.provider = q.provider or name
            if q.found:
                return q
            answers.append(q)
        for q in answers:  # an error or a protocol without a query: we learnt nothing
            if q.status == "ERROR" or not q.supported:
                return q
        return answers[0] if answers else QueryResult(False)

    def _soonest_breaker(self) -> float:
        waits = [b.retry_in() for b in self.breakers.values() if b.state != "closed"]
        return max(0.05, min(waits)) if waits else 0.05

    def breaker_states(self) -> dict[str, str]:
        return {n: b.state for n, b in self.breakers.items()}

    async def close(self) -> None:
        for p in self.providers.values():
            await p.close()
