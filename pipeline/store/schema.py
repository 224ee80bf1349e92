"""The record store's schema, as data: the DDL, the column lists and the rows'
field positions, the SQL of the order-free merge (the upsert) and of the
one-time migration. Nothing here touches a database (pipeline/store/store.py
runs it).

Tables
------
``notify_record``
    Seed 000's columns (``id`` … ``sent_at``; times are Unix seconds as REAL,
    ``user_id`` is TEXT) plus ``delivery_id``, ``notification_id``,
    ``category``, ``priority``, ``updated_at``, ``delivered_at``,
    ``accepted_at`` (when the event was accepted at the entrance) and
    ``latency_ms``, ``producer`` (whose key space the business key belongs to;
    ``''`` for the operator's) and ``pref_version`` (the user's preferences
    version the decision was taken with), ``scheduled_at`` (when it was
    deferred on purpose: quiet hours, ``send_at``), ``template_version`` (the
    version rendered: a gray release may give a newer one than asked); ``UNIQUE (producer, biz_key,
    user_id, channel)``: seed 000's rule within one producer's key space (a
    file from before is rebuilt once on open). ``id`` is the rowid,
    assigned on insert, so new records append to the table b-tree and ``id``
    orders records by creation (used as the pagination cursor).

    Three internal INTEGER columns make every field an order-free merge (see
    :meth:`RecordStore.apply_outcomes` and merge.py): ``state_key`` (rank of the
    state shown, then the time of the outcome that set it), ``provider_key`` and ``msg_key``
    (the same key for the outcome that set ``provider``/``provider_msg_id``).
    Queries do not return them.

``attempts``
    Seed 001's ``attempts(notification_id, seq, channel, started_at, result,
    next_at)`` plus ``provider``, ``latency_ms``, ``retry_after``,
    ``provider_msg_id``, ``error`` and ``delivery_id``; primary key
    ``(delivery_id, seq)``, ``WITHOUT ROWID`` (one b-tree, clustered by
    delivery: ``attempts(delivery_id)`` is one range read).

``device_deliveries``
    A push's delivery to each of the user's devices, under the push's one record,
    whose state is derived from them (pipeline/store/devices.py: DELIVERED or
    ACCEPTED as soon as one device's provider took it, FAILED only once every
    device's failed). An outcome whose ``delivery_id`` is a device's
    (``<record's delivery_id>.<device>``) goes to both.

``inbox`` / ``inbox_unread``
    The in-app inbox (``delivery_id`` unique, so a replayed delivery adds no
    second message) and a per-user unread counter. The counter, rather than a
    ``count(*)`` over a partial index, because the badge is read far more often
    than the inbox is written and a user with a large unread backlog would make
    every read O(backlog). It is maintained by triggers on ``inbox`` (insert of
    an unread row, read_at set or cleared, delete of an unread row), so every
    write path — ``add_inbox``, ``mark_read``, a retention ``DELETE`` — keeps it
    equal to the number of unread rows, inside the same transaction.

``receipt_polls``
    How far the receipt polls went (agents/polls.py): one row, the ``(sent_at,
    delivery_id)`` of the last ACCEPTED record looked at; the records after it that
    are still ACCEPTED ``receipt_poll_s`` after ``sent_at`` are asked about next
    (through the partial index ``ix_record_awaiting``, which holds the ACCEPTED
    records only).

``clicks`` / ``reads`` / ``unsubscribes``
    Tracking (docs/SCHEMA.md "Tracking"): every click on a rewritten link
    (``delivery_id`` of the record, the link's index and target, time, a hash
    of the user agent); the first read of a delivery per ``kind`` (``inbox``,
    ``push_open``, ``email_open``; primary key ``(delivery_id, kind)``); every
    opt-out (user, ``category.channel`` switch, ``source``, time, producer;
    ``UNIQUE (user_id, category, channel, at)``: written by agents/users.py with
    the update's own time, so a replayed update adds no second row).
"""

from __future__ import annotations

from types import SimpleNamespace

from . import devices
from .rows import insert_rows

# ---------------------------------------------------------------------------
# schema

_SCHEMA = """
CREATE TABLE IF NOT EXISTS notify_record (
    id              INTEGER PRIMARY KEY,
    biz_key         TEXT    NOT NULL,
    user_id         TEXT    NOT NULL,
    channel         TEXT    NOT NULL,
    template_code   TEXT    NOT NULL,
    status          TEXT    NOT NULL,
    reason          TEXT,
    provider        TEXT,
    provider_msg_id TEXT,
    retry_count     INTEGER NOT NULL DEFAULT 0,
    created_at      REAL    NOT NULL,
    sent_at         REAL,
    delivery_id     TEXT    NOT NULL,
    notification_id TEXT    NOT NULL,
    category        TEXT,
    priority        TEXT,
    updated_at      REAL    NOT NULL,
    delivered_at    REAL,
    accepted_at     REAL,
    latency_ms      REAL,
    state_key       INTEGER NOT NULL,
    provider_key    INTEGER,
    msg_key         INTEGER,
    producer        TEXT    NOT NULL DEFAULT '',
    pref_version    INTEGER,
    scheduled_at    REAL,
    template_version INTEGER,
    callback        INTEGER,
    UNIQUE (producer, biz_key, user_id, channel)
);
CREATE UNIQUE INDEX IF NOT EXISTS ux_record_delivery ON notify_record (delivery_id);
CREATE INDEX IF NOT EXISTS ix_record_notification ON notify_record (notification_id);
CREATE INDEX IF NOT EXISTS ix_record_provider_msg ON notify_record (provider_msg_id)
    WHERE provider_msg_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS ix_record_user ON notify_record (user_id);
CREATE INDEX IF NOT EXISTS ix_record_created ON notify_record (created_at, status, reason);

CREATE TABLE IF NOT EXISTS attempts (
    notification_id TEXT    NOT NULL,
    seq             INTEGER NOT NULL,
    channel         TEXT    NOT NULL,
    provider        TEXT    NOT NULL,
    started_at      REAL    NOT NULL,
    result          TEXT    NOT NULL,
    next_at         REAL,
    latency_ms      REAL,
    retry_after     REAL,
    provider_msg_id TEXT,
    error           TEXT,
    delivery_id     TEXT    NOT NULL,
    PRIMARY KEY (delivery_id, seq)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS inbox (
    id          INTEGER PRIMARY KEY,
    user_id     TEXT NOT NULL,
    delivery_id TEXT NOT NULL UNIQUE,
    title       TEXT NOT NULL,
    body        TEXT NOT NULL,
    created_at  REAL NOT NULL,
    read_at     REAL
);
CREATE INDEX IF NOT EXISTS ix_inbox_user ON inbox (user_id);

CREATE TABLE IF NOT EXISTS inbox_unread (
    user_id TEXT PRIMARY KEY,
    unread  INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;

CREATE TRIGGER IF NOT EXISTS tr_inbox_insert AFTER INSERT ON inbox
WHEN NEW.read_at IS NULL BEGIN
    INSERT OR IGNORE INTO inbox_unread (user_id, unread) VALUES (NEW.user_id, 0);
    UPDATE inbox_unread SET unread = unread + 1 WHERE user_id = NEW.user_id;
END;
CREATE TRIGGER IF NOT EXISTS tr_inbox_read AFTER UPDATE OF read_at ON inbox
WHEN OLD.read_at IS NULL AND NEW.read_at IS NOT NULL BEGIN
    UPDATE inbox_unread SET unread = unread - 1 WHERE user_id = OLD.user_id;
END;
CREATE TRIGGER IF NOT EXISTS tr_inbox_unread AFTER UPDATE OF read_at ON inbox
WHEN OLD.read_at IS NOT NULL AND NEW.read_at IS NULL BEGIN
    INSERT OR IGNORE INTO inbox_unread (user_id, unread) VALUES (NEW.user_id, 0);
    UPDATE inbox_unread SET unread = unread + 1 WHERE user_id = NEW.user_id;
END;
CREATE TRIGGER IF NOT EXISTS tr_inbox_delete AFTER DELETE ON inbox
WHEN OLD.read_at IS NULL BEGIN
    UPDATE inbox_unread SET unread = unread - 1 WHERE user_id = OLD.user_id;
END;

"""
_OBJECTS = (
    "notify_record", "ux_record_delivery", "ix_record_notification", "ix_record_provider_msg",
    "ix_record_user", "ix_record_created", "attempts", "inbox", "ix_inbox_user", "inbox_unread",
    "tr_inbox_insert", "tr_inbox_read", "tr_inbox_unread", "tr_inbox_delete",
)  # fmt: skip
# tracking (pipeline/rules/tracking.py, pipeline/api/routes/tracking.py)
_SCHEMA += """
CREATE TABLE IF NOT EXISTS clicks (
    id          INTEGER PRIMARY KEY,
    delivery_id TEXT    NOT NULL,
    link        INTEGER NOT NULL,
    url         TEXT    NOT NULL,
    at          REAL    NOT NULL,
    ua_hash     TEXT
);
CREATE INDEX IF NOT EXISTS ix_clicks_delivery ON clicks (delivery_id);

CREATE TABLE IF NOT EXISTS reads (
    delivery_id TEXT NOT NULL,
    kind        TEXT NOT NULL,
    at          REAL NOT NULL,
    PRIMARY KEY (delivery_id, kind)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS unsubscribes (
    id       INTEGER PRIMARY KEY,
    user_id  TEXT NOT NULL,
    category TEXT NOT NULL,
    channel  TEXT NOT NULL,
    source   TEXT NOT NULL,
    at       REAL NOT NULL,
    producer TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS ix_unsubscribes_user ON unsubscribes (user_id);
CREATE INDEX IF NOT EXISTS ix_unsubscribes_at ON unsubscribes (at);
-- one row per opt-out however often its update is applied (agents/users.py: ``at``
-- is the update's own broker timestamp); a file from before this key keeps its first
-- row of any duplicate
DELETE FROM unsubscribes WHERE id NOT IN (SELECT min(id) FROM unsubscribes GROUP BY user_id, category, channel, at);
CREATE UNIQUE INDEX IF NOT EXISTS ux_unsubscribes_once ON unsubscribes (user_id, category, channel, at);
"""
_OBJECTS += ("clicks", "ix_clicks_delivery", "reads", "unsubscribes", "ix_unsubscribes_user", "ix_unsubscribes_at",
             "ux_unsubscribes_once")
# receipt polls (agents/polls.py): the records a provider took and whose receipt has
# not come, oldest first (a partial index: a record leaves it with its receipt), and
# how far the polls have gone (one row)
_SCHEMA += """
CREATE INDEX IF NOT EXISTS ix_record_awaiting ON notify_record (sent_at, delivery_id) WHERE status = 'ACCEPTED';
CREATE TABLE IF NOT EXISTS receipt_polls (
    id          INTEGER PRIMARY KEY CHECK (id = 0),
    sent_at     REAL NOT NULL,
    delivery_id TEXT NOT NULL
);
"""
_OBJECTS += ("ix_record_awaiting", "receipt_polls")
# a push's deliveries, one per device, under its one record (devices.py)
_SCHEMA += devices.SCHEMA
_OBJECTS += devices.OBJECTS

#: what queries return for a record (seed 000's columns first)
RECORD_COLUMNS: tuple[str, ...] = (
    "id", "biz_key", "user_id", "channel", "template_code", "status", "reason",
    "provider", "provider_msg_id", "retry_count", "created_at", "sent_at",
    "delivery_id", "notification_id", "category", "priority", "updated_at",
    "delivered_at", "accepted_at", "latency_ms", "producer", "pref_version", "template_version",
)  # fmt: skip
_RECORD_SELECT = ", ".join(RECORD_COLUMNS)

ATTEMPT_COLUMNS: tuple[str, ...] = (
    "notification_id", "seq", "channel", "provider", "started_at", "result", "next_at",
    "latency_ms", "retry_after", "provider_msg_id", "error", "delivery_id",
)  # fmt: skip


def of_record(column: str, record: str) -> str:
    """SQL: ``column`` is the delivery id ``record`` (a column or a parameter) or that
    of one of its deliveries to a device (``<record>.<device>``: devices.py), as a
    range on the column's index."""
    return f"({column} = {record} OR ({column} > {record} || '.' AND {column} < {record} || '/'))"


# the order of the values _row() (merge.py) builds and the upsert takes
_ROW_COLUMNS = (
    "delivery_id", "notification_id", "biz_key", "user_id", "channel", "template_code",
    "category", "priority",
    "status", "reason", "state_key",
    "provider", "provider_key", "provider_msg_id", "msg_key",
    "retry_count", "created_at", "updated_at", "sent_at", "delivered_at", "accepted_at",
    "latency_ms", "producer", "pref_version", "scheduled_at", "template_version", "callback",
)  # fmt: skip
(
    _DID, _NID, _BIZ, _UID, _CH, _TPL, _CAT, _PRI,
    _STATUS, _REASON, _SKEY,
    _PROV, _PKEY, _MSG, _MKEY,
    _RETRY, _CREATED, _UPDATED, _SENT, _DELIVERED, _ACCEPTED, _LATENCY, _PRODUCER, _PREFV, _SCHEDULED, _TPLV,
    _CALLBACK,
) = range(len(_ROW_COLUMNS))  # fmt: skip
#: columns a store made before them gets by ``ALTER TABLE ... ADD COLUMN`` (nullable,
#: no rule of their own: no rebuild): NULL in the rows written before
_ADDED_COLUMNS = {"callback": "INTEGER"}
#: the positions devices.row reads
_IX = SimpleNamespace(STATUS=_STATUS, REASON=_REASON, SKEY=_SKEY, PROV=_PROV, PKEY=_PKEY, MSG=_MSG, MKEY=_MKEY,
                      RETRY=_RETRY, CREATED=_CREATED, UPDATED=_UPDATED, SENT=_SENT, DELIVERED=_DELIVERED,
                      LATENCY=_LATENCY)


def _least(col: str) -> str:
    """min() that ignores NULL (SQLite's scalar min returns NULL if any argument is)."""
    return f"coalesce(min({col}, excluded.{col}), {col}, excluded.{col})"


def _keyed(val: str, key: str) -> tuple[str, str]:
    win = (
        f"(excluded.{key} IS NOT NULL AND ({key} IS NULL OR excluded.{key} > {key}"
        f" OR (excluded.{key} = {key} AND excluded.{val} > {val})))"
    )
    return (
        f"{val} = CASE WHEN {win} THEN excluded.{val} ELSE {val} END",
        f"{key} = CASE WHEN {win} THEN excluded.{key} ELSE {key} END",
    )


# The merge of two rows, field by field; every rule is a join (commutative,
# associative, idempotent), so applying outcomes in any order, any number of
# times, gives the same row. Each SET expression reads the row's old values.
# (The same rules in Python, to fold a batch first: merge.py _merge_rows.)
_STATE_WIN = (
    "(excluded.state_key > state_key OR (excluded.state_key = state_key"
    " AND coalesce(excluded.reason, '') > coalesce(reason, '')))"
)
#: a batch's rows in a few statements of many rows (rows.py ``bind``, ``run``)
_UPSERT = insert_rows(
    "INSERT INTO notify_record", _ROW_COLUMNS,
    "ON CONFLICT (delivery_id) DO UPDATE SET "
    + ", ".join(
        (
            f"status = CASE WHEN {_STATE_WIN} THEN excluded.status ELSE status END",
            f"reason = CASE WHEN {_STATE_WIN} THEN excluded.reason ELSE reason END",
            "state_key = max(state_key, excluded.state_key)",
            *_keyed("provider", "provider_key"),
            *_keyed("provider_msg_id", "msg_key"),
            "retry_count = max(retry_count, excluded.retry_count)",
            "created_at = min(created_at, excluded.created_at)",
            "updated_at = max(updated_at, excluded.updated_at)",
            f"sent_at = {_least('sent_at')}",
            f"delivered_at = {_least('delivered_at')}",
            f"accepted_at = {_least('accepted_at')}",
            f"latency_ms = {_least('latency_ms')}",
            "pref_version = coalesce(max(pref_version, excluded.pref_version), pref_version, excluded.pref_version)",
            f"scheduled_at = {_least('scheduled_at')}",
            "template_version = coalesce(max(template_version, excluded.template_version), template_version,"
            " excluded.template_version)",
            # whether its event's producer hears of its state changes (agents/callbacks.py): 1 once an
            # outcome said so; NULL only in rows written before the column
            "callback = max(coalesce(callback, 0), excluded.callback)",
        )
    )
)

_INSERT_ATTEMPT = insert_rows("INSERT OR IGNORE INTO attempts", ATTEMPT_COLUMNS)

# ---------------------------------------------------------------------------
# migration (RecordStore._migrate)

#: notify_record's indexes, dropped before the table is rebuilt (the schema makes them again)
_RECORD_INDEXES = ("ux_record_delivery", "ix_record_notification", "ix_record_provider_msg",
                   "ix_record_user", "ix_record_created", "ix_record_awaiting")


def _rebuild_sql(keep: str) -> str:
    """The script that rebuilds ``notify_record`` with the current schema, keeping its
    rows' ``id`` and the columns ``keep`` (comma-separated) the old table has."""
    return (
        "BEGIN IMMEDIATE;\n"
        + "".join(f"DROP INDEX IF EXISTS {i};\n" for i in _RECORD_INDEXES)
        + "ALTER TABLE notify_record RENAME TO notify_record_old;\n"
        + _SCHEMA
        + f"\nINSERT INTO notify_record (id, {keep}) SELECT id, {keep} FROM notify_record_old;\n"
        + "DROP TABLE notify_record_old;\nCOMMIT;"
    )
