"""Seed 001's service level as pure functions (pipeline/rules/slo.py), and the
report over a real SQLite record store, the API route and `notify slo`."""

from __future__ import annotations

import calendar
import json
import os
import subprocess
import sys
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline import ids
from pipeline.models import Attempt, Outcome
from pipeline.rules import slo
from pipeline.rules.slo import EventRow
from pipeline.store import RecordStore
from tests.api.conftest import api, api_app_factory  # noqa: F401

NOW = 1_800_000_000.0


def row(lat, priority="high", deferred=False, at=NOW - 1000, category="otp"):
    return EventRow(priority, category, at, lat, deferred)


def test_the_goal_is_judged_on_terminal_events_and_late_open_ones():
    rows = [row(100.0)] * 997 + [row(61_000.0)] + [row(None)] + [row(None, at=NOW - 5)]
    r = slo.summarize(rows, NOW - 3600, NOW, NOW)
    a = r["all"]
    assert (a["events"], a["terminal"], a["within_goal"], a["open_past_goal"], a["open_in_goal"]) == \
        (1000, 998, 997, 1, 1)
    assert a["ratio"] == round(997 / 999, 6) and not a["met"] and not r["met"]
    assert a["p50_ms"] == 100.0 and a["max_ms"] == 61_000.0


def test_deferred_events_are_apart_per_category_and_not_held_to_the_goal():
    rows = [row(50.0, "normal", category="transaction")] * 10 + \
           [row(8 * 3600_000.0, "low", deferred=True, category="marketing")] * 3
    r = slo.summarize(rows, NOW - 86400, NOW, NOW)
    assert r["met"] and r["all"]["events"] == 10 and list(r["priorities"]) == ["normal"]
    assert r["deferred"]["marketing"]["events"] == 3 and r["deferred"]["marketing"]["p50_ms"] == 8 * 3600_000.0
    assert "met" not in r["deferred"]["marketing"]


@given(st.lists(st.one_of(st.none(), st.floats(0, 200_000)), max_size=200))
def test_counts_add_up_and_percentiles_are_ordered(lats):
    r = slo.summarize([row(x) for x in lats], 0, NOW, NOW)["all"]
    assert r["terminal"] + r["open_past_goal"] + r["open_in_goal"] == r["events"] == len(lats)
    assert r["within_goal"] <= r["terminal"]
    if r["terminal"]:
        assert r["p50_ms"] <= r["p99_ms"] <= r["p999_ms"] <= r["max_ms"]
    else:
        assert r["p50_ms"] is None and r["ratio"] in (None, 0.0)  # only late open ones: none within


def test_times_and_months():
    assert slo.parse_time("1700000000") == 1_700_000_000.0
    assert slo.parse_time("2026-12-01") == calendar.timegm((2026, 12, 1, 0, 0, 0))
    assert slo.parse_time("2026-12-01T01:00:00+01:00") == calendar.timegm((2026, 12, 1, 0, 0, 0))
    for bad in ("soon", "nan", "inf", ""):
        with pytest.raises(ValueError):
            slo.parse_time(bad)
    assert slo.parse_time("-5") == 0.0 and slo.parse_time("1e300") == slo.parse_time("2286-11-20T17:46:39")
    assert slo.month_range("2026-12", 0) == (calendar.timegm((2026, 12, 1, 0, 0, 0)),
                                             calendar.timegm((2027, 1, 1, 0, 0, 0)))
    assert slo.month_range(None, calendar.timegm((2026, 2, 14, 5, 0, 0)))[0] == calendar.timegm((2026, 2, 1, 0, 0, 0))
    for bad in ("2026-13", "12-2026", "x"):
        with pytest.raises(ValueError):
            slo.month_range(bad, 0)


def _o(biz, user, channel, state, at, acc, reason=None, attempt=None, priority="high", producer=""):
    return Outcome(delivery_id=ids.delivery_id(biz, user, channel, producer),
                   notification_id=ids.notification_id(biz, user, producer), biz_key=biz, user_id=user,
                   channel=channel, category="otp" if priority == "high" else "marketing", template="otp",
                   priority=priority, state=state, at=at, accepted_at=acc, reason=reason, attempt=attempt,
                   latency_ms=(at - acc) * 1000.0, producer=producer)


def test_first_terminal_is_once_per_delivery():
    a = Attempt(delivery_id="d", seq=1, channel="sms", provider="p", started_at=NOW, result="ACCEPTED")
    assert slo.first_terminal(_o("b", "u", "sms", "ACCEPTED", NOW, NOW - 1, attempt=a))
    assert not slo.first_terminal(_o("b", "u", "sms", "DELIVERED", NOW, NOW - 1))  # a receipt after ACCEPTED
    assert slo.first_terminal(_o("b", "u", "inbox", "DELIVERED", NOW, NOW - 1, reason="in_inbox"))
    assert slo.first_terminal(_o("b", "u", "sms", "FILTERED", NOW, NOW - 1, reason="opted_out"))
    assert not slo.first_terminal(_o("b", "u", "sms", "FILTERED", NOW, NOW - 1, reason="duplicate"))
    assert not slo.first_terminal(_o("b", "u", "sms", "PENDING", NOW, NOW - 1))


async def _filled_store(path, now):
    store = await RecordStore(str(path)).open()
    acc = now - 600
    await store.apply_outcomes([
        # an OTP to two users on two channels: terminal when the slowest is (2 s)
        _o("otp:1", "u1", "sms", "PENDING", acc, acc), _o("otp:1", "u1", "sms", "ACCEPTED", acc + 2, acc),
        _o("otp:1", "u2", "sms", "PENDING", acc, acc), _o("otp:1", "u2", "sms", "ACCEPTED", acc + 0.5, acc),
        # an OTP that took 90 s
        _o("otp:2", "u1", "sms", "PENDING", acc, acc), _o("otp:2", "u1", "sms", "FAILED", acc + 90, acc),
        # an OTP still in flight after 10 minutes: late
        _o("otp:3", "u1", "sms", "PENDING", acc, acc),
        # marketing deferred by quiet hours, delivered 5 minutes later
        _o("m:1", "u1", "inbox", "SCHEDULED", acc, acc, reason="deferred", priority="low"),
        _o("m:1", "u1", "inbox", "DELIVERED", acc + 300, acc, reason="in_inbox", priority="low"),
        # another producer's event
        _o("otp:1", "u1", "sms", "PENDING", acc, acc, producer="bank"),
        _o("otp:1", "u1", "sms", "ACCEPTED", acc + 1, acc, producer="bank"),
    ])
    return store


async def test_the_store_aggregates_events(tmp_path):
    now = time.time()
    store = await _filled_store(tmp_path / "r.db", now)
    try:
        r = slo.summarize(await store.slo_events(now - 3600, now + 1), now - 3600, now + 1, now)
        high = r["priorities"]["high"]
        # otp:1 of the operator and of bank, otp:2, otp:3
        assert (high["events"], high["within_goal"], high["terminal"], high["open_past_goal"]) == (4, 2, 3, 1)
        assert high["max_ms"] == pytest.approx(90_000, abs=1)
        assert r["deferred"]["marketing"]["events"] == 1 and not r["met"]
        mine = slo.summarize(await store.slo_events(now - 3600, now + 1, producer="bank"), 0, now + 1, now)
        assert mine["all"]["events"] == 1 and mine["met"]
    finally:
        await store.close()


async def test_the_api_reports_the_callers_events(api):
    now = time.time()
    store = await _filled_store(api.store_path, now)
    await store.close()
    status, body = await api.call("GET", "/v1/slo", "all")  # admin: every producer
    assert status == 200, body
    assert body["all"]["events"] == 4 and body["deferred"]["marketing"]["events"] == 1
    status, body = await api.call("GET", f"/v1/slo?since={int(now) + 10}", "reader")
    assert status == 400 and body["error"]["field"] == "until" or body["all"]["events"] == 0
    status, body = await api.call("GET", "/v1/slo?month=2026-13", "reader")
    assert status == 400 and body["error"]["code"] == "bad_value"
    status, body = await api.call("GET", f"/v1/slo?since={int(now) - 3600}", "reader")
    assert status == 200 and body["all"]["events"] == 0  # the reader's producer ("test") sent none


async def test_notify_slo_prints_the_report(tmp_path):
    now = time.time()
    store = await _filled_store(tmp_path / "records.db", now)
    await store.close()
    env = dict(os.environ, NOTIFY_DB=str(tmp_path / "records.db"), NOTIFY_DATA_DIR=str(tmp_path))
    cmd = [sys.executable, "-m", "pipeline.cli", "slo", "--since", str(int(now) - 3600)]
    out = subprocess.run(cmd + ["--json"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["priorities"]["high"]["events"] == 4
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert "MISSED" in out.stdout and "deferred on purpose" in out.stdout, out.stdout
    out = subprocess.run(cmd[:-2] + ["--month", "2026-13"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "Traceback" not in out.stderr and "YYYY-MM" in out.stderr
