"""The record store's deliveries of one record (their table, its upsert, a device
delivery's row, and the record's state derived from them): a push goes to each
of the user's devices, one delivery each (pipeline/rules/plan.py ``per_device``), and the
record of the channel (``notify_record``, one per ``(producer, biz_key,
user_id, channel)`` as always) shows what they add up to.

``device_deliveries``
    One row per device delivery: ``record_id`` (the record's ``delivery_id``),
    ``delivery_id`` (the device delivery's own: ``<record_id>.<device digest>``,
    the id its outcomes, attempts, inflight marks, retries, dead letters and
    provider idempotency key carry), ``status``/``reason`` and ``provider``,
    ``provider_msg_id``, ``retry_count``, ``sent_at``, ``delivered_at``,
    ``latency_ms`` (to its first terminal outcome), merged from its outcomes by
    the record's own order-free rules (:mod:`pipeline.store.merge`), and ``devices``:
    how many devices the notification went to (the outcomes say it).
    Primary key ``(record_id, delivery_id)``, ``WITHOUT ROWID``; indexed by
    ``provider_msg_id``: a push provider's receipt (Huawei Push Kit's) names the
    message sent to one device, and decides that device's delivery.

The record's ``status``/``reason`` is then derived from its deliveries'
(:func:`pipeline.rules.states.of_deliveries`): ACCEPTED / UNDELIVERED /
DELIVERED as soon as a provider took it for one device; in flight while any
device's delivery is (or has not been seen yet); FAILED (REVIEW, FILTERED)
only once every device's delivery stopped without a provider taking it. Its
``latency_ms`` is the first device's that a provider took, or, when none did,
the last device's to stop. Every other field of the record is the merge of all
its deliveries' outcomes, as for any record: ``provider``/``provider_msg_id`` of
the highest outcome carrying one, ``retry_count`` the most calls one device
took, ``sent_at`` the first acceptance. A record's outcomes of the whole
channel (SCHEDULED before the devices were known, a FILTERED of a replay)
count only while it has no device delivery.

Every transaction that writes an outcome of a push record derives the record
again from all its deliveries, so the record stays order-free: the same
outcomes in any order, any number of times, give the same rows.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

import sqlite3

from ..rules.states import EVIDENCE, IN_FLIGHT, RANK, of_deliveries
from .rows import insert_rows, run

__all__ = ["SCHEMA", "OBJECTS", "COLUMNS", "UPSERT", "apply"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS device_deliveries (
    record_id       TEXT    NOT NULL,
    delivery_id     TEXT    NOT NULL,
    status          TEXT    NOT NULL,
    reason          TEXT,
    state_key       INTEGER NOT NULL,
    provider        TEXT,
    provider_key    INTEGER,
    provider_msg_id TEXT,
    msg_key         INTEGER,
    retry_count     INTEGER NOT NULL DEFAULT 0,
    devices         INTEGER NOT NULL DEFAULT 0,
    created_at      REAL    NOT NULL,
    updated_at      REAL    NOT NULL,
    sent_at         REAL,
    delivered_at    REAL,
    latency_ms      REAL,
    PRIMARY KEY (record_id, delivery_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS ix_device_provider_msg ON device_deliveries (provider_msg_id)
    WHERE provider_msg_id IS NOT NULL;
"""
OBJECTS = ("device_deliveries", "ix_device_provider_msg")

#: what :meth:`RecordStore.deliveries` returns per device delivery
COLUMNS = ("delivery_id", "status", "reason", "provider", "provider_msg_id", "retry_count", "devices",
           "created_at", "updated_at", "sent_at", "delivered_at", "latency_ms")

_COLS = ("record_id", "delivery_id", "status", "reason", "state_key", "provider", "provider_key",
         "provider_msg_id", "msg_key", "retry_count", "devices", "created_at", "updated_at", "sent_at",
         "delivered_at", "latency_ms")

_STATE_WIN = (
    "(excluded.state_key > state_key OR (excluded.state_key = state_key"
    " AND coalesce(excluded.reason, '') > coalesce(reason, '')))"
)


def _keyed(val: str, key: str) -> str:
    win = (f"(excluded.{key} IS NOT NULL AND ({key} IS NULL OR excluded.{key} > {key}"
           f" OR (excluded.{key} = {key} AND excluded.{val} > {val})))")
    return (f"{val} = CASE WHEN {win} THEN excluded.{val} ELSE {val} END, "
            f"{key} = CASE WHEN {win} THEN excluded.{key} ELSE {key} END")


def _least(col: str) -> str:
    return f"{col} = coalesce(min({col}, excluded.{col}), {col}, excluded.{col})"


#: the same join as a record's (pipeline/store/schema.py _UPSERT), per device delivery
UPSERT = insert_rows(
    "INSERT INTO device_deliveries", _COLS,
    "ON CONFLICT (record_id, delivery_id) DO UPDATE SET "
    + ", ".join((
        f"status = CASE WHEN {_STATE_WIN} THEN excluded.status ELSE status END",
        f"reason = CASE WHEN {_STATE_WIN} THEN excluded.reason ELSE reason END",
        "state_key = max(state_key, excluded.state_key)",
        _keyed("provider", "provider_key"),
        _keyed("provider_msg_id", "msg_key"),
        "retry_count = max(retry_count, excluded.retry_count)",
        "devices = max(devices, excluded.devices)",
        "created_at = min(created_at, excluded.created_at)",
        "updated_at = max(updated_at, excluded.updated_at)",
        _least("sent_at"), _least("delivered_at"), _least("latency_ms"),
    ))
)

_CHUNK = 400


def row(record_id: str, delivery_id: str, devices: int, r: list, ix: Any) -> tuple:
    """A device delivery's row from the record row ``r`` built for its outcome(s)
    (``ix``: the record row's field positions, pipeline/store/schema.py ``_IX``)."""
    return (record_id, delivery_id, r[ix.STATUS], r[ix.REASON], r[ix.SKEY], r[ix.PROV], r[ix.PKEY], r[ix.MSG],
            r[ix.MKEY], r[ix.RETRY], devices, r[ix.CREATED], r[ix.UPDATED], r[ix.SENT], r[ix.DELIVERED],
            r[ix.LATENCY])


def apply(conn: sqlite3.Connection, rows: Optional[list], records: Iterable[str], k: int) -> None:
    """In the record store's transaction: merge the device deliveries' ``rows`` (their
    upsert, rows.py ``bind`` of :data:`UPSERT`; None: none), then
    derive the state of every record in ``records`` (push records the batch touched)
    that has device deliveries. ``k``: the store's state-key scale (rank × k + µs).
    Runs in the writer's thread (store.py ``_transact``)."""
    if rows is not None:
        run(conn, rows)
    records = list(dict.fromkeys(records))
    updates = []
    for i in range(0, len(records), _CHUNK):
        chunk = records[i:i + _CHUNK]
        by_record: dict[str, list] = {}
        shown: dict[str, tuple] = {}
        found = conn.execute(
            "SELECT d.record_id, d.status, d.reason, d.state_key, d.devices, d.latency_ms,"
            " r.status, r.reason, r.state_key, r.latency_ms"
            " FROM device_deliveries d JOIN notify_record r ON r.delivery_id = d.record_id"
            f" WHERE d.record_id IN ({','.join('?' * len(chunk))})", chunk,
        ).fetchall()
        for rid, status, reason, skey, n, latency, *record in found:
            by_record.setdefault(rid, []).append((status, reason, skey, n, latency))
            shown[rid] = tuple(record)
        for rid, members in by_record.items():
            want = derive(members, k)
            if want != shown[rid]:  # mostly it is already (one device: the record's own merge)
                updates.append((*want, rid))
    if updates:
        conn.executemany(
            "UPDATE notify_record SET status = ?, reason = ?, state_key = ?, latency_ms = ? WHERE delivery_id = ?",
            updates,
        )


def derive(members: list[tuple], k: int) -> tuple[str, Optional[str], int, Optional[float]]:
    """(status, reason, state_key, latency_ms) of a record from its device deliveries'
    ``(status, reason, state_key, devices, latency_ms)``."""
    expected = max(m[3] for m in members)
    state = of_deliveries([m[0] for m in members], expected)
    if state in EVIDENCE:
        win = max((m for m in members if m[0] == state), key=_order)
        took = [m[4] for m in members if m[0] in EVIDENCE and m[4] is not None]
        return state, win[1], win[2], min(took) if took else None
    if state in IN_FLIGHT:
        flying = [m for m in members if m[0] == state]
        if flying:
            win = max(flying, key=_order)
            return state, win[1], win[2], None
        # a device's delivery not seen yet: pending, as of the latest change seen
        return state, None, RANK[state] * k + max(m[2] % k for m in members), None
    win = max(members, key=_order)
    done = [m[4] for m in members if m[4] is not None]
    return win[0], win[1], win[2], max(done) if done else None


def _order(m: tuple) -> tuple:
    return m[2], m[1] or ""
