"""One dispatcher round (adapters/dispatch.py): a lane's call deadline
(``[call_deadline_s]``: a provider call with no answer by then is
``TIMEOUT_UNKNOWN``, reconciled by query before any resend, and never failed over; a
provider that cannot be queried keeps its adapter's own timeout), and a provider
out of rate passed over for the next of the route."""

from __future__ import annotations

import time

import pytest

from adapters.dispatch import Dispatcher
from adapters.fake import FakeProvider
from adapters.simulators.twilio_sim import RECONCILE_PARAM
from adapters.sms_twilio import TwilioConfig, TwilioSmsProvider
from adapters.sms_vendor import VendorSmsConfig, VendorSmsProvider
from config.settings import ConfigError, load_settings
from pipeline.models import AttemptResult


async def test_a_hung_call_is_unknown_at_the_deadline_and_reconciled_not_failed_over(twilio_sim, vendor_sim,
                                                                                     make_delivery):
    twilio = TwilioSmsProvider(TwilioConfig(account_sid=twilio_sim.account_sid, auth_token=twilio_sim.auth_token,
                                            from_number="+15005550006", base_url=twilio_sim.base_url,
                                            reconcile_param=RECONCILE_PARAM, timeout=10.0))
    vendor = VendorSmsProvider(VendorSmsConfig(base_url=vendor_sim.base_url, api_key=vendor_sim.api_key))
    disp = Dispatcher({"twilio": twilio, "smsvendor": vendor}, {"sms": ["twilio", "smsvendor"]})
    try:
        d = make_delivery("sms", "+14155550004", {"body": "code"}, priority="high")  # ...0004: taken, then no answer
        t0 = time.monotonic()
        rnd = await disp.send(d, deadline=0.4)
        took = time.monotonic() - t0
        [r] = rnd.results  # no failover: the provider may have it
        assert r.result == AttemptResult.TIMEOUT_UNKNOWN and r.provider == "twilio" and "deadline" in r.error, r
        assert 0.35 <= took < 2.0 and 350 <= r.latency_ms < 2000, (took, r.latency_ms)
        q = await disp.query(d.derive(unknown_provider="twilio"))
        assert q.found  # reconciled: taken, so no resend
        assert twilio_sim.core.calls(d.delivery_id) == 1 and len(vendor_sim.core.ledger) == 0
        # an ordinary number answers well within the deadline
        ok = (await disp.send(make_delivery("sms", "+14155550123", {"body": "code"}), deadline=0.4)).results
        assert [x.result for x in ok] == [AttemptResult.ACCEPTED]
    finally:
        await disp.close()


async def test_a_provider_without_a_query_keeps_its_own_timeout(make_delivery):
    slow = FakeProvider("noquery", "sms", latency_s=0.3, query_supported=False)
    disp = Dispatcher({"noquery": slow}, {"sms": ["noquery"]})
    [r] = (await disp.send(make_delivery("sms", "+14155550123", {"body": "x"}), deadline=0.05)).results
    assert r.result == AttemptResult.ACCEPTED  # a deadline would have made it unknowable (REVIEW)


def test_the_deadlines_by_priority_from_the_config(tmp_path):
    assert dict(load_settings(env={}).call_deadlines) == {"high": 1.5}
    cfg = tmp_path / "n.toml"
    cfg.write_text("[call_deadline_s]\nnormal = 3\n")
    assert dict(load_settings(cfg, env={}).call_deadlines) == {"high": 1.5, "normal": 3.0}
    for bad in ("urgent = 1", "high = 0", "high = \"soon\""):
        cfg.write_text(f"[call_deadline_s]\n{bad}\n")
        with pytest.raises(ConfigError, match="call_deadline_s"):
            load_settings(cfg, env={})


async def test_a_provider_out_of_rate_passes_the_delivery_to_the_next_of_the_route(make_delivery):
    """A burst beyond the first SMS vendor's quota spills over to the second instead
    of queueing behind it; with every provider out of rate, nothing is called and the
    round says when the soonest has a token; a delivery pinned to a provider (its
    fate unknown) never spills over."""
    t = [0.0]
    a, b = FakeProvider("sms_a", "sms"), FakeProvider("sms_b", "sms", primary=False)
    disp = Dispatcher({"sms_a": a, "sms_b": b}, {"sms": ["sms_a", "sms_b"]},
                      rates={"sms_a": (10.0, 1.0), "sms_b": (4.0, 1.0)}, now=lambda: t[0])
    sent = [(await disp.send(make_delivery("sms", f"+1415555{i:04d}", {"body": "x"}))) for i in range(3)]
    assert [[r.provider for r in rnd.results] for rnd in sent] == [["sms_a"], ["sms_b"], []]
    assert sent[2].wait_s == pytest.approx(0.1)  # sms_a's next token (10/s) comes before sms_b's (4/s)
    t[0] += 0.1
    pinned = make_delivery("sms", "+14155550123", {"body": "x"}).derive(unknown_provider="sms_b")
    rnd = await disp.send(pinned, reconciled=True)  # sms_b still out of rate, sms_a has a token
    assert rnd.results == [] and rnd.wait_s == pytest.approx(0.15)
    assert [r.provider for r in (await disp.send(make_delivery("sms", "+14155550124", {"body": "x"}))).results] \
        == ["sms_a"]


def test_a_bucket_serves_its_line_one_token_each_in_the_order_they_came():
    from adapters.resilience.token_bucket import TokenBucket

    t = [0.0]
    b = TokenBucket(10.0, 1.0, now=lambda: t[0])
    assert [b.reserve(1.0) for _ in range(4)] == pytest.approx([0.0, 0.1, 0.2, 0.3])
    assert b.reserve(0.35) is None  # 0.4 s away: nothing taken
    t[0] += 0.3  # the three owed tokens came and went to the line
    assert b.try_acquire() == (False, pytest.approx(0.1))
    b.give_back()  # a reserved call not made
    assert b.try_acquire() == (True, 0.0)


async def test_a_burst_past_every_providers_quota_waits_in_line_and_each_call_is_made_once(make_delivery):
    """Deliveries out of rate on every provider of the route wait for a token in line
    (``most_wait``) instead of polling: each gets a token of its own, in the order
    they came, and each provider is asked once per delivery."""
    a, b = FakeProvider("sms_a", "sms"), FakeProvider("sms_b", "sms", primary=False)
    disp = Dispatcher({"sms_a": a, "sms_b": b}, {"sms": ["sms_a", "sms_b"]},
                      rates={"sms_a": (100.0, 5.0), "sms_b": (50.0, 5.0)})
    import asyncio

    tries = []
    buckets = dict(disp.buckets)
    for name, bucket in buckets.items():
        real = bucket.try_acquire

        def counted(n=1, _real=real, _name=name):
            tries.append(_name)
            return _real(n)

        bucket.try_acquire = counted
    t0 = time.monotonic()
    rounds = await asyncio.gather(*(disp.send(make_delivery("sms", f"+1415555{i:02d}99", {"body": "x"}), most_wait=2.0)
                                    for i in range(40)))  # ...99: no scenario number
    took = time.monotonic() - t0
    assert all(len(r.results) == 1 and r.results[0].result == AttemptResult.ACCEPTED for r in rounds)
    used = [r.results[0].provider for r in rounds]
    # 10 from the bursts, then 150/s between the two: 30 more in ~0.2 s
    assert 0.12 < took < 1.0, took
    assert used.count("sms_b") >= 8  # the second vendor takes its share of the line
    assert len(tries) <= 2 * 40  # each delivery looked at each bucket once at most
    # without a line (most_wait 0) a round with no token says when to come back
    rnd = await disp.send(make_delivery("sms", "+14155559999", {"body": "x"}))
    assert rnd.results == [] and rnd.wait_s is not None


async def test_a_message_that_fails_the_same_way_everywhere_does_not_open_the_second_providers_breaker(
        make_delivery):
    """The second vendor sees mostly the failovers, i.e. the messages that failed at
    the first: when one fails there the same way, that says more about the message
    than about the vendor (the demo's scenario numbers opened its breaker and shut
    its quota out of a burst). A failure of its own kind still counts."""
    a, b = FakeProvider("sms_a", "sms"), FakeProvider("sms_b", "sms", primary=False)
    disp = Dispatcher({"sms_a": a, "sms_b": b}, {"sms": ["sms_a", "sms_b"]})
    for i in range(12):
        rnd = await disp.send(make_delivery("sms", f"+141555{i:02d}0007", {"body": "x"}))  # ...0007: 500 everywhere
        assert [r.provider for r in rnd.results] == ["sms_a", "sms_b"]
        await disp.send(make_delivery("sms", f"+141555{i:02d}0099", {"body": "x"}))  # sms_a healthy otherwise
    assert disp.breakers["sms_b"].state == "closed" and disp.breakers["sms_a"].state == "closed"
    # sms_b down: the failovers of throttled messages (429 at sms_a) fail there otherwise (503): counted
    b.mode = "down"
    for i in range(5):
        await disp.send(make_delivery("sms", f"+141555{i:02d}0002", {"body": "x"}))  # ...0002: 429 on a first call
    assert disp.breakers["sms_b"].state == "open"
