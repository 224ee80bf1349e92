"""A business key belongs to its producer (issue 26): the same ``biz_key`` from
two producers is two events, end to end (the API's idempotency, the guard's
dedup, the ids, the record store's UNIQUE rule), and a ``records:read`` key
reads its own producer's records only, unless it has the ``admin`` scope.
Records keep the producer and the preferences version their decision used."""

from __future__ import annotations

import sqlite3
import time

from pipeline import ids
from pipeline.api.auth import add_key
from pipeline.models import Outcome
from pipeline.store import RecordStore
from tests.pipeline.harness import Pipeline
from tests.transport.helpers import wait_until


def event(biz: str = "order:42", user: str = "u1", **kw) -> dict:
    return {"biz_key": biz, "category": "transaction", "template": "order_shipped", "recipients": [user],
            "channels": ["inbox"], "params": {"order_no": "42", "carrier": "UPS", "tracking_no": "1Z",
                                              "tracking_url": "https://t.example/x"}, **kw}


def keys_for(api, *producers: str, scopes=("events:write", "records:read")) -> dict[str, str]:
    return {p: add_key(api.keys_path, p, list(scopes))[1] for p in producers}


async def test_the_same_biz_key_from_two_producers_is_two_events(api):
    k = keys_for(api, "shop", "bank")
    status, shop = await api.call("POST", "/v1/events", k["shop"], json=event())
    assert status == 202, shop
    # another producer's same key, even with other content: accepted, its own ids
    status, bank = await api.call("POST", "/v1/events", k["bank"], json=event(params={"order_no": "7",
                                  "carrier": "DHL", "tracking_no": "9", "tracking_url": "https://t.example/y"}))
    assert status == 202, bank
    assert shop["notifications"][0]["notification_id"] == ids.notification_id("order:42", "u1", "shop")
    assert bank["notifications"][0]["notification_id"] == ids.notification_id("order:42", "u1", "bank")
    assert shop["notifications"] != bank["notifications"]
    # within one producer the key is still idempotent: a repeat is the original, a change a conflict
    status, again = await api.call("POST", "/v1/events", k["shop"], json=event())
    assert status == 200 and again["status"] == "duplicate" and again["accepted_at"] == shop["accepted_at"]
    assert again["notifications"][0]["notification_id"] == shop["notifications"][0]["notification_id"]
    status, clash = await api.call("POST", "/v1/events", k["shop"], json=event(params={"order_no": "1",
                                   "carrier": "UPS", "tracking_no": "1", "tracking_url": "https://t.example/z"}))
    assert status == 409 and clash["error"]["code"] == "biz_key_conflict"
    # a body cannot claim another producer's key space
    status, forged = await api.call("POST", "/v1/events", k["bank"], json=event("order:43", producer="shop"))
    assert status == 202
    assert forged["notifications"][0]["notification_id"] == ids.notification_id("order:43", "u1", "bank")


def _outcome(producer: str, biz: str = "inv:1", user: str = "u5") -> Outcome:
    return Outcome(delivery_id=ids.delivery_id(biz, user, "sms", producer),
                   notification_id=ids.notification_id(biz, user, producer), biz_key=biz, user_id=user,
                   channel="sms", category="transaction", template="order_shipped", priority="normal",
                   state="DELIVERED", at=time.time(), producer=producer, pref_version=3)


async def test_a_reader_sees_its_own_producers_records_and_admin_sees_all(api):
    store = await RecordStore(str(api.store_path)).open()
    await store.apply_outcomes([_outcome("shop"), _outcome("bank"), _outcome("")])
    await store.close()
    k = keys_for(api, "shop", scopes=("records:read",))
    admin = add_key(api.keys_path, "ops", ["records:read", "admin"])[1]

    status, mine = await api.call("GET", "/v1/notifications?user_id=u5", k["shop"])
    assert status == 200 and [(r["producer"], r["pref_version"]) for r in mine["items"]] == [("shop", 3)]
    status, _ = await api.call("GET", f"/v1/notifications/{ids.notification_id('inv:1', 'u5', 'bank')}", k["shop"])
    assert status == 404  # another producer's notification is not found, not forbidden
    status, own = await api.call("GET", f"/v1/notifications/{ids.notification_id('inv:1', 'u5', 'shop')}",
                                 k["shop"])
    assert status == 200 and own["deliveries"][0]["producer"] == "shop"
    status, everyone = await api.call("GET", "/v1/notifications?user_id=u5", admin)
    assert status == 200 and sorted(r["producer"] for r in everyone["items"]) == ["", "bank", "shop"]
    # users' inboxes and preferences are not a producer's records: users:read
    status, body = await api.call("GET", "/v1/users/u5/inbox", k["shop"])
    assert status == 403 and "users:read" in body["error"]["message"]


async def test_a_store_from_before_producers_is_rebuilt_with_its_rows(tmp_path):
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE notify_record (
            id INTEGER PRIMARY KEY, biz_key TEXT NOT NULL, user_id TEXT NOT NULL, channel TEXT NOT NULL,
            template_code TEXT NOT NULL, status TEXT NOT NULL, reason TEXT, provider TEXT, provider_msg_id TEXT,
            retry_count INTEGER NOT NULL DEFAULT 0, created_at REAL NOT NULL, sent_at REAL,
            delivery_id TEXT NOT NULL, notification_id TEXT NOT NULL, category TEXT, priority TEXT,
            updated_at REAL NOT NULL, delivered_at REAL, accepted_at REAL, latency_ms REAL,
            state_key INTEGER NOT NULL, provider_key INTEGER, msg_key INTEGER,
            UNIQUE (biz_key, user_id, channel));
        CREATE UNIQUE INDEX ux_record_delivery ON notify_record (delivery_id);
    """)
    old = _outcome("")
    db.execute("INSERT INTO notify_record (id, biz_key, user_id, channel, template_code, status, created_at, "
               "delivery_id, notification_id, updated_at, state_key) VALUES (7, ?, ?, ?, 't', 'SENT', 1, ?, ?, 1, 1)",
               (old.biz_key, old.user_id, old.channel, old.delivery_id, old.notification_id))
    db.commit()
    db.close()
    store = await RecordStore(str(path)).open()
    try:
        await store.apply_outcomes([_outcome("shop")])  # the same (biz_key, user, channel), another producer
        rows, _ = await store.find(user_id="u5")
        assert sorted((r["id"] == 7, r["producer"], r["status"]) for r in rows) == [
            (False, "shop", "DELIVERED"), (True, "", "SENT")]
    finally:
        await store.close()


def test_two_producers_same_key_both_delivered_with_their_preferences_version(redis_url, tmp_path):
    """On a real worker: the guard's dedup does not take one producer's event for
    the other's, and each record keeps the producer and the preferences version."""
    pipe = Pipeline(redis_url, tmp_path)
    try:
        pipe.preferences([{"user_id": "pv1", "version": 5, "tz": "UTC"}])
        proc = pipe.start()
        wait_until(lambda: "Worker ready" in pipe.log() or proc.poll() is not None, 60, 0.1, "the worker ready")
        pipe.events([event("dup:1", "pv1", producer="shop"), event("dup:1", "pv1", producer="bank")])

        def rows():
            with sqlite3.connect(pipe.db) as db:
                return db.execute("SELECT producer, status, reason, pref_version FROM notify_record "
                                  "WHERE biz_key = 'dup:1' ORDER BY producer").fetchall()
        wait_until(lambda: pipe.db.exists() and len(rows()) == 2 and all(r[1] == "DELIVERED" for r in rows()),
                   60, 0.2, "both producers' notifications delivered")
        assert rows() == [("bank", "DELIVERED", "in_inbox", 5), ("shop", "DELIVERED", "in_inbox", 5)]
    finally:
        pipe.stop()
