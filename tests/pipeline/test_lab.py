"""Seed 001's lab, end to end on the real pipeline: ok, limited, uncertain, revoked."""

import time

import pytest

from pipeline.ids import delivery_id

from .harness import Pipeline


@pytest.fixture
def pipe(redis_url, tmp_path):
    p = Pipeline(redis_url, tmp_path)
    yield p
    p.stop()


def test_seed_001_lab(pipe):
    users = {"ok": "+15550001000", "limited": "+15550000002", "uncertain": "+15550000004", "revoked": None}
    pipe.preferences([
        {"user_id": "u-ok", "phone": users["ok"], "version": 1},
        {"user_id": "u-limited", "phone": users["limited"], "version": 1},
        {"user_id": "u-uncertain", "phone": users["uncertain"], "version": 1},
        {"user_id": "u-revoked", "email": "revoked@example.com", "version": 1},
    ])
    pipe.start()
    sms = {"category": "transaction", "template": "otp", "channels": ["sms"], "params": {"code": "123456"}}
    pipe.events([
        {**sms, "biz_key": "lab:ok", "recipients": ["u-ok"]},
        {**sms, "biz_key": "lab:limited", "recipients": ["u-limited"]},
        {**sms, "biz_key": "lab:uncertain", "recipients": ["u-uncertain"]},
        {"category": "marketing", "template": "promo", "channels": ["email"], "biz_key": "lab:revoked",
         "recipients": ["u-revoked"], "send_at": time.time() + 12,
         "params": {"headline": "Sale", "discount": "10%", "url": "https://example.com/sale"}},
    ])
    pipe.wait_rows(lambda r: r.get(("lab:revoked", "u-revoked", "email"), {}).get("status") == "SCHEDULED", 30,
                   "revoked scheduled")
    # the user unsubscribes while the marketing message waits
    pipe.preferences([{"user_id": "u-revoked", "email": "revoked@example.com", "version": 2,
                       "switches": {"marketing.email": False}}])
    pipe.events([{**sms, "biz_key": "lab:ok", "recipients": ["u-ok"]}])  # a duplicate of ok
    done = {"ACCEPTED", "FILTERED"}
    rows = pipe.wait_rows(lambda r: len(r) >= 4 and all(v["status"] in done for v in r.values()), 90, "all terminal")
    assert len(rows) == 4  # the duplicate created nothing
    assert rows[("lab:ok", "u-ok", "sms")]["status"] == "ACCEPTED"
    assert rows[("lab:limited", "u-limited", "sms")]["status"] == "ACCEPTED"
    assert rows[("lab:uncertain", "u-uncertain", "sms")]["status"] == "ACCEPTED"  # reconciled, not resent
    revoked = rows[("lab:revoked", "u-revoked", "email")]
    assert (revoked["status"], revoked["reason"]) == ("FILTERED", "unsubscribed")
    attempts = pipe.attempts()
    counts = {name: attempts.get(delivery_id(f"lab:{name}", f"u-{name}", ch), 0)
              for name, ch in (("ok", "sms"), ("limited", "sms"), ("uncertain", "sms"), ("revoked", "email"))}
    assert counts == {"limited": 2, "ok": 1, "revoked": 0, "uncertain": 1}
