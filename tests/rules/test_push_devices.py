"""Push to every device (issue 24, item 1), the rules: the plan makes one delivery
per device (newest first, at most ``[channels.push] max_devices``), each with its
own id; the record's state is derived from its deliveries (pipeline/rules/states.py
``of_deliveries``) and the record store applies that rule order-free."""

import asyncio
import itertools
import random
from dataclasses import replace

import pytest

from config.settings import ConfigError, load_settings
from pipeline.ids import delivery_id, device_delivery_id, record_id, split_delivery_id
from pipeline.models import Attempt, Intent, Outcome, Preferences, State
from pipeline.rules.plan import outcome, plan_intent, push_targets
from pipeline.rules.states import of_deliveries
from pipeline.store import RecordStore
from pipeline.templates import Renderer

S = load_settings(env={})
R = Renderer.from_settings(S)
NOW = 1_800_000_000.0
A, F, P, U, SC, FI, RV, D = (State.ACCEPTED, State.FAILED, State.PENDING, State.UNKNOWN, State.SCHEDULED,
                             State.FILTERED, State.REVIEW, State.DELIVERED)


def intent(**kw):
    base = dict(notification_id="n_1", biz_key="b1", user_id="u1", category="transaction", template="order_shipped",
                template_version=1, priority="normal", accepted_at=NOW - 1, channels=["push"],
                params={"order_no": "A1", "carrier": "UPS", "tracking_no": "T", "tracking_url": "https://t"})
    base.update(kw)
    return Intent(**base)


def plan(i, devices, settings=S):
    return plan_intent(i, settings=settings, renderer=R, prefs=Preferences(user_id="u1"), devices=devices, now=NOW,
                       dedup_seen=lambda k: None, count_today=lambda k: 0, recent_sends=lambda k: [])


def test_a_push_goes_to_every_device_each_its_own_delivery():
    phone, tablet = ["apns", "a" * 64, 100.0], ["fcm", "f" * 40, 200.0]
    p = plan(intent(), [phone, tablet])
    rec = delivery_id("b1", "u1", "push")
    assert [(d.address, d.devices) for d in p.deliveries] == [(f"fcm:{'f' * 40}", 2), (f"apns:{'a' * 64}", 2)]
    ids = [d.delivery_id for d in p.deliveries]
    assert ids == [device_delivery_id(rec, "fcm", "f" * 40), device_delivery_id(rec, "apns", "a" * 64)]
    assert len(set(ids)) == 2 and all(record_id(i) == rec and i.startswith(rec + ".") for i in ids)
    assert all(split_delivery_id(i) == ("n_" + rec[2:].split(".")[0], "push") for i in ids)
    assert all("a" * 64 not in i and "f" * 40 not in i for i in ids)  # no token in an id
    # one PENDING outcome per device, each under its own delivery id, saying how many devices
    assert [(o.delivery_id, o.state, o.devices) for o in p.outcomes] == [(i, P, 2) for i in ids]
    # the same device always gets the same delivery, whatever else the user has
    again = plan(intent(), [tablet])
    assert [d.delivery_id for d in again.deliveries] == ids[:1] and again.deliveries[0].devices == 1
    # rendered once for the channel: same content on every device
    assert p.deliveries[0].content == p.deliveries[1].content


def test_over_the_cap_the_oldest_devices_are_left_out_and_said_so():
    devs = [["apns", f"tok{i:02d}", 1000.0 + i] for i in range(12)]
    random.Random(3).shuffle(devs)
    p = plan(intent(), devs)
    assert [d.address for d in p.deliveries] == [f"apns:tok{i:02d}" for i in range(11, 1, -1)]
    assert p.devices_not_sent == 2
    assert {o.detail for o in p.outcomes} == {"sent to the 10 most recently registered of 12 devices"}
    small = replace(S, channels={**S.channels, "push": replace(S.channels["push"], max_devices=1)})
    p = plan(intent(), devs, small)
    assert [d.address for d in p.deliveries] == ["apns:tok11"] and p.devices_not_sent == 11
    assert push_targets([["apns", "x", 5.0], ["apns", "x", 6.0], ["fcm", "y", 0]], 10) == (
        [("apns", "x"), ("fcm", "y")], 0)


def test_max_devices_is_configured_for_push_only(tmp_path):
    assert S.channels["push"].max_devices == 10
    cfg = tmp_path / "c.toml"
    cfg.write_text("[channels.push]\nmax_devices = 3\n")
    assert load_settings(cfg, env={}).channels["push"].max_devices == 3
    for bad in ("[channels.push]\nmax_devices = 0\n", "[channels.sms]\nmax_devices = 3\n"):
        cfg.write_text(bad)
        with pytest.raises(ConfigError):
            load_settings(cfg, env={})


@pytest.mark.parametrize("states,expected,want", [
    ([A, F], 2, A),          # one device got it: the user got it
    ([F, A], 2, A),
    ([D, F], 2, D),
    ([F, F], 2, F),          # failed only when every device failed
    ([F, P], 2, P),          # one still in flight: not decided
    ([F, U], 2, U),
    ([F], 2, P),             # the other device's delivery not seen yet
    ([F, SC], 2, SC),
    ([FI, F], 2, F),
    ([RV, F], 2, RV),
    ([A, U], 2, A),
    ([F], 1, F),             # one device: its own state
    ([A], 0, A),
])
def test_a_record_is_what_its_deliveries_add_up_to(states, expected, want):
    assert of_deliveries(states, expected) == want
    for perm in itertools.permutations(states):
        assert of_deliveries(perm, expected) == want


# ---------------------------------------------------------------------------- the store


def _outcomes():
    """A push to two devices: the phone's provider takes it, the tablet's token is dead."""
    i = intent()
    p = plan(i, [["apns", "a" * 64, 100.0], ["fcm", "gone" + "f" * 36, 200.0]])
    tablet, phone = p.deliveries
    out = list(p.outcomes)
    att = Attempt(delivery_id=phone.delivery_id, seq=1, channel="push", provider="apns", started_at=NOW + 1,
                  result="ACCEPTED", provider_msg_id="m-1")
    out.append(outcome(phone, "push", A, NOW + 1, provider="apns", provider_msg_id="m-1", retry_count=1, attempt=att))
    att = Attempt(delivery_id=tablet.delivery_id, seq=1, channel="push", provider="fcm", started_at=NOW + 2,
                  result="PERMANENT_ERROR", error="UNREGISTERED")
    out.append(outcome(tablet, "push", F, NOW + 2, reason="bad_token", provider="fcm", retry_count=1, attempt=att))
    return out, phone, tablet


def _apply(tmp_path, batches):
    tmp_path.mkdir(parents=True, exist_ok=True)

    async def go():
        store = await RecordStore(str(tmp_path / "r.db")).open()
        try:
            for b in batches:
                await store.apply_outcomes(b)
            rec = delivery_id("b1", "u1", "push")
            return (await store.get(rec)), (await store.deliveries(rec)), (await store.attempts(rec))
        finally:
            await store.close()
    return asyncio.run(go())


def test_the_store_keeps_one_record_and_each_devices_delivery(tmp_path):
    out, phone, tablet = _outcomes()
    (rec,), devs, atts = _apply(tmp_path, [out])
    assert (rec["status"], rec["reason"], rec["provider"], rec["provider_msg_id"]) == (A, None, "apns", "m-1")
    assert rec["delivery_id"] == delivery_id("b1", "u1", "push") and rec["latency_ms"] == pytest.approx(2000.0)
    assert {d["delivery_id"]: (d["status"], d["reason"], d["provider"], d["devices"]) for d in devs} == {
        phone.delivery_id: (A, None, "apns", 2), tablet.delivery_id: (F, "bad_token", "fcm", 2)}
    assert [(a["delivery_id"], a["provider"], a["result"]) for a in atts] == sorted([
        (phone.delivery_id, "apns", "ACCEPTED"), (tablet.delivery_id, "fcm", "PERMANENT_ERROR")])


def test_the_record_is_order_free_and_never_failed_while_a_device_may_get_it(tmp_path):
    out, phone, tablet = _outcomes()
    want = None
    for n, perm in enumerate(itertools.permutations(out)):
        if n % 5:
            continue
        (rec,), devs, _ = _apply(tmp_path / str(n), [[o] for o in perm] + [list(perm)])  # one by one, then again
        got = (rec["status"], rec["reason"], rec["provider"], rec["retry_count"], rec["latency_ms"],
               sorted((d["delivery_id"], d["status"]) for d in devs))
        want = want or got
        assert got == want
    # only the tablet's failure seen so far: the phone's delivery is pending, so is the record
    (rec,), _, _ = _apply(tmp_path / "partial", [[out[-1]]])
    assert rec["status"] == P and rec["latency_ms"] is None
    # both failed: FAILED
    failed = outcome(phone, "push", F, NOW + 3, reason="bad_token", provider="apns", retry_count=1)
    (rec,), _, _ = _apply(tmp_path / "both", [out[:2] + [out[-1], failed]])
    assert (rec["status"], rec["reason"]) == (F, "bad_token")


def test_a_device_delivery_is_found_by_its_own_id_and_a_forged_one_is_refused(tmp_path):
    out, phone, _tablet = _outcomes()

    async def go():
        store = await RecordStore(str(tmp_path / "r.db")).open()
        try:
            await store.apply_outcomes(out)
            assert [r["delivery_id"] for r in await store.get(phone.delivery_id)] == [record_id(phone.delivery_id)]
            # a device id whose record is not the one its fields name
            forged = Outcome(**{**out[-1].asdict(), "attempt": None,
                                "delivery_id": delivery_id("b2", "u1", "push") + ".0123456789ab"})
            assert await store.apply_valid_outcomes([forged]) != []
        finally:
            await store.close()
    asyncio.run(go())
