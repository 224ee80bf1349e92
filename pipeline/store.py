"""The record store: delivery records, attempts and the in-app inbox, on SQLite.

One file, WAL mode, ``synchronous=NORMAL``: a commit is an append to the WAL
(no fsync), readers never block the writer. A process crash loses nothing that
was committed; a power cut or OS crash may lose the last transactions (the
sink then re-reads those outcomes only if their offsets were not committed).

Two connections: one writer (every write goes through it, one transaction at a
time, serialised by an ``asyncio.Lock``) and one ``query_only`` reader for the
API, support and CLI queries, so a long query never delays a sink batch.

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
    :meth:`RecordStore.apply_outcomes`): ``state_key`` (rank of the state shown,
    then the time of the outcome that set it), ``provider_key`` and ``msg_key``
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
    whose state is derived from them (pipeline/store_devices.py: DELIVERED or
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

Errors
------
A transient storage failure (disk I/O error, database locked/busy, disk full,
read-only or unopenable file) raises :class:`StoreUnavailable` after rolling
the whole transaction back: a batch is applied entirely or not at all, and the
caller retries the same batch later. An outcome the store cannot take (unknown
state, a delivery_id that contradicts its biz_key/user_id/channel) raises
:class:`InvalidOutcome` (nothing applied; ``.outcomes`` lists the culprits).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Iterable, Mapping, Optional, Sequence

import aiosqlite

from . import ids, store_devices
from .models import State
from .rules.slo import EventRow
from .rules.states import PRECEDENCE, RANK, TERMINAL

# aiosqlite logs a DEBUG record per statement, from its thread; with log records
# redacted as they are made (pipeline/redact.py) that cost ~15% of a worker's CPU
# under load for lines nobody reads
logging.getLogger("aiosqlite").setLevel(logging.WARNING)
log = logging.getLogger("notify.store")

__all__ = ["RecordStore", "StoreUnavailable", "InvalidOutcome", "InboxItem", "RECORD_COLUMNS"]

#: the outcome fold gives the event loop a turn every this many outcomes
FOLD_TURN = 256
# state_key = rank * _K + microseconds: orders by rank, then by time (fits in int64
# until the year 2286)
_K = 10**16
_STATE_ACCEPTED = State.ACCEPTED
_STATE_DELIVERED = State.DELIVERED
_STATE_SCHEDULED = State.SCHEDULED


class StoreUnavailable(Exception):
    """The database cannot be written (or read) right now; retry the same call later."""


class InvalidOutcome(ValueError):
    """Outcomes the store refuses; none of the batch was applied."""

    def __init__(self, message: str, outcomes: Sequence[Any]):
        super().__init__(message)
        self.outcomes = list(outcomes)


@dataclass(frozen=True, slots=True)
class InboxItem:
    user_id: str
    delivery_id: str
    title: str
    body: str
    created_at: float = 0.0


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
# a push's deliveries, one per device, under its one record (pipeline/store_devices.py)
_SCHEMA += store_devices.SCHEMA
_OBJECTS += store_devices.OBJECTS

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

# the order of the values _row() builds and the upsert takes
_ROW_COLUMNS = (
    "delivery_id", "notification_id", "biz_key", "user_id", "channel", "template_code",
    "category", "priority",
    "status", "reason", "state_key",
    "provider", "provider_key", "provider_msg_id", "msg_key",
    "retry_count", "created_at", "updated_at", "sent_at", "delivered_at", "accepted_at",
    "latency_ms", "producer", "pref_version", "scheduled_at", "template_version",
)  # fmt: skip
(
    _DID, _NID, _BIZ, _UID, _CH, _TPL, _CAT, _PRI,
    _STATUS, _REASON, _SKEY,
    _PROV, _PKEY, _MSG, _MKEY,
    _RETRY, _CREATED, _UPDATED, _SENT, _DELIVERED, _ACCEPTED, _LATENCY, _PRODUCER, _PREFV, _SCHEDULED, _TPLV,
) = range(len(_ROW_COLUMNS))  # fmt: skip
#: the positions store_devices.row reads
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
_STATE_WIN = (
    "(excluded.state_key > state_key OR (excluded.state_key = state_key"
    " AND coalesce(excluded.reason, '') > coalesce(reason, '')))"
)
_UPSERT = (
    f"INSERT INTO notify_record ({', '.join(_ROW_COLUMNS)}) "
    f"VALUES ({', '.join('?' * len(_ROW_COLUMNS))}) "
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
        )
    )
)

_INSERT_ATTEMPT = (
    f"INSERT OR IGNORE INTO attempts ({', '.join(ATTEMPT_COLUMNS)}) "
    f"VALUES ({', '.join('?' * len(ATTEMPT_COLUMNS))})"
)

_TRANSIENT_CODES = frozenset(
    (
        sqlite3.SQLITE_BUSY,
        sqlite3.SQLITE_LOCKED,
        sqlite3.SQLITE_READONLY,
        sqlite3.SQLITE_IOERR,
        sqlite3.SQLITE_FULL,
        sqlite3.SQLITE_CANTOPEN,
        sqlite3.SQLITE_PROTOCOL,
    )
)
_TRANSIENT_TEXT = (
    "disk i/o error",
    "database is locked",
    "database table is locked",
    "database is busy",
    "readonly database",
    "disk is full",
    "unable to open database file",
)


def is_transient(exc: BaseException) -> bool:
    """Whether a sqlite3 error means "storage unavailable now" rather than a bug."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int) and (code & 0xFF) in _TRANSIENT_CODES:
        return True
    text = str(exc).lower()
    return any(t in text for t in _TRANSIENT_TEXT)


# ---------------------------------------------------------------------------
# outcome → row, and the same merge in Python (to fold a batch before SQL)


def _least_py(a: Optional[float], b: Optional[float]) -> Optional[float]:
    if a is None:
        return b
    if b is None:
        return a
    return a if a <= b else b


def _row(o: Any) -> list[Any]:
    state = o.state
    r = RANK[state]
    at = float(o.at)
    if not 0.0 <= at < 1e10:  # also NaN
        raise ValueError(f"outcome time out of range: {at!r}")
    key = r * _K + round(at * 1_000_000)
    provider = o.provider
    msg = o.provider_msg_id
    acc = o.accepted_at or None
    latency = None
    if state in TERMINAL:
        latency = o.latency_ms or (max(0.0, (at - acc) * 1000.0) if acc else None)
    return [
        o.delivery_id, o.notification_id, o.biz_key, o.user_id, o.channel, o.template,
        o.category, o.priority,
        state, o.reason, key,
        provider, key if provider is not None else None,
        msg, key if msg is not None else None,
        o.retry_count or 0, at, at,
        at if state == _STATE_ACCEPTED else None,
        at if state == _STATE_DELIVERED else None,
        acc, latency, o.producer or "", o.pref_version or None,
        at if state == _STATE_SCHEDULED else None,
        getattr(o, "template_version", 0) or None,
    ]  # fmt: skip


def _merge_keyed(a: list[Any], b: list[Any], vi: int, ki: int) -> None:
    bk = b[ki]
    if bk is None:
        return
    ak = a[ki]
    if ak is None or bk > ak or (bk == ak and b[vi] > a[vi]):
        a[vi] = b[vi]
        a[ki] = bk


def _merge_rows(a: list[Any], b: list[Any]) -> None:
    """Merge row ``b`` into row ``a`` in place: the SQL upsert's rules, in Python."""
    if b[_SKEY] > a[_SKEY] or (b[_SKEY] == a[_SKEY] and (b[_REASON] or "") > (a[_REASON] or "")):
        a[_STATUS] = b[_STATUS]
        a[_REASON] = b[_REASON]
        a[_SKEY] = b[_SKEY]
    _merge_keyed(a, b, _PROV, _PKEY)
    _merge_keyed(a, b, _MSG, _MKEY)
    if b[_RETRY] > a[_RETRY]:
        a[_RETRY] = b[_RETRY]
    if b[_CREATED] < a[_CREATED]:
        a[_CREATED] = b[_CREATED]
    if b[_UPDATED] > a[_UPDATED]:
        a[_UPDATED] = b[_UPDATED]
    for i in (_SENT, _DELIVERED, _ACCEPTED, _LATENCY, _SCHEDULED):
        a[i] = _least_py(a[i], b[i])
    for i in (_PREFV, _TPLV):
        if b[i] is not None and (a[i] is None or b[i] > a[i]):
            a[i] = b[i]


def _field(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _attempt_row(o: Any, a: Any) -> tuple[Any, ...]:
    if isinstance(a, dict):  # an Outcome built from raw JSON without coercion
        get = a.get
    else:
        def get(name: str, default: Any = None) -> Any:
            return getattr(a, name, default)

    result = get("result")
    if not isinstance(result, str) or not result:
        raise ValueError(f"attempt without a result: {a!r}")
    return (
        o.notification_id,
        int(get("seq")),
        get("channel") or o.channel,
        get("provider") or o.provider or "",
        float(get("started_at", 0.0)),
        result,
        get("next_at"),
        get("latency_ms"),
        get("retry_after"),
        get("provider_msg_id"),
        get("error"),
        get("delivery_id") or o.delivery_id,
    )


# ---------------------------------------------------------------------------


class RecordStore:
    """Delivery records, attempts and inboxes in one SQLite file (see module doc)."""

    def __init__(
        self,
        path: str,
        *,
        busy_timeout_ms: int = 2000,
        cache_mib: int = 64,
        wal_autocheckpoint: int = 10000,
    ):
        self.path = str(path)
        self.wal_autocheckpoint = wal_autocheckpoint
        self.busy_timeout_ms = busy_timeout_ms
        self.cache_mib = cache_mib
        self._db: Optional[aiosqlite.Connection] = None
        self._ro: Optional[aiosqlite.Connection] = None
        self._wlock = asyncio.Lock()
        self._rlock = asyncio.Lock()

    # -- lifecycle ----------------------------------------------------------

    async def open(self) -> "RecordStore":
        try:
            db = await aiosqlite.connect(self.path, isolation_level=None)
        except sqlite3.OperationalError as exc:
            raise StoreUnavailable(f"cannot open {self.path}: {exc}") from exc
        self._db = db
        try:
            await self._pragmas(db)
            mode = await self._scalar(db, "PRAGMA journal_mode=WAL")
            if str(mode).lower() != "wal" and self.path != ":memory:":
                raise StoreUnavailable(f"{self.path}: journal_mode is {mode}, not wal")
            await db.execute("PRAGMA synchronous=NORMAL")
            # checkpoint (and fsync) every ~40 MiB of WAL rather than 4 MiB: a hot page
            # is copied back once per checkpoint, and the sink's commits stay cheap
            await db.execute(f"PRAGMA wal_autocheckpoint={int(self.wal_autocheckpoint)}")
            await db.execute("PRAGMA journal_size_limit=67108864")
            await db.execute(f"PRAGMA cache_size=-{self.cache_mib * 1024}")
            marks = ", ".join("?" * len(_OBJECTS))
            present = await self._scalar(
                db, f"SELECT count(*) FROM sqlite_master WHERE name IN ({marks})", _OBJECTS
            )
            if present != len(_OBJECTS):  # (an existing file may be read-only: no DDL then)
                await db.executescript("BEGIN IMMEDIATE;\n" + _SCHEMA + "\nCOMMIT;")
            await self._migrate(db)
            if self.path == ":memory:":  # one connection: reads queue behind writes
                self._ro = db
                self._rlock = self._wlock
            else:
                ro = await aiosqlite.connect(self.path, isolation_level=None)
                self._ro = ro
                await self._pragmas(ro)
                await ro.execute("PRAGMA query_only=1")
            self._ro.row_factory = sqlite3.Row
        except BaseException as exc:
            await self.close()
            if is_transient(exc):
                raise StoreUnavailable(f"cannot open {self.path}: {exc}") from exc
            raise
        return self

    async def _migrate(self, db: aiosqlite.Connection) -> None:
        """A file made before records kept their producer and preferences version:
        rebuild ``notify_record`` with both columns and the producer-scoped UNIQUE
        rule (existing rows: the operator's key space, ``producer = ''``)."""
        cols = [r[1] for r in await db.execute_fetchall("PRAGMA table_info(notify_record)")]
        if not cols or all(c in cols for c in _ROW_COLUMNS):
            return
        keep = ", ".join(c for c in _ROW_COLUMNS if c in cols)
        indexes = ("ux_record_delivery", "ix_record_notification", "ix_record_provider_msg",
                   "ix_record_user", "ix_record_created")
        log.warning("%s: adding %s to notify_record (one-time rebuild)", self.path,
                    ", ".join(c for c in _ROW_COLUMNS if c not in cols))
        await db.executescript(
            "BEGIN IMMEDIATE;\n"
            + "".join(f"DROP INDEX IF EXISTS {i};\n" for i in indexes)
            + "ALTER TABLE notify_record RENAME TO notify_record_old;\n"
            + _SCHEMA
            + f"\nINSERT INTO notify_record (id, {keep}) SELECT id, {keep} FROM notify_record_old;\n"
            + "DROP TABLE notify_record_old;\nCOMMIT;"
        )

    async def _pragmas(self, db: aiosqlite.Connection) -> None:
        await db.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_ms)}")
        await db.execute("PRAGMA temp_store=MEMORY")

    async def close(self) -> None:
        ro, db = self._ro, self._db
        self._ro = self._db = None
        if ro is not None and ro is not db:
            await ro.close()
        if db is not None:
            await db.close()

    async def __aenter__(self) -> "RecordStore":
        return await self.open()

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    @staticmethod
    async def _scalar(db: aiosqlite.Connection, sql: str, params: Sequence[Any] = ()) -> Any:
        async with db.execute(sql, params) as cur:
            row = await cur.fetchone()
        return None if row is None else row[0]

    def _writer(self) -> aiosqlite.Connection:
        if self._db is None:
            raise RuntimeError("RecordStore is not open")
        return self._db

    def _reader(self) -> aiosqlite.Connection:
        if self._ro is None:
            raise RuntimeError("RecordStore is not open")
        return self._ro

    async def _write(self, work) -> Any:
        """Run ``work(db)`` in one IMMEDIATE transaction; all or nothing."""
        db = self._writer()
        async with self._wlock:
            try:
                await db.execute("BEGIN IMMEDIATE")
                result = await work(db)
                await db.execute("COMMIT")
                return result
            except BaseException as exc:
                await self._rollback(db)
                if is_transient(exc):
                    raise StoreUnavailable(str(exc)) from exc
                raise

    @staticmethod
    async def _rollback(db: aiosqlite.Connection) -> None:
        # Unconditional: statements run in order on the connection's thread, so this
        # ROLLBACK also undoes a BEGIN or a statement still queued when we were
        # cancelled. "no transaction is active" (SQLITE_FULL/IOERR may have rolled
        # back already) is fine.
        try:
            await db.execute("ROLLBACK")
        except sqlite3.Error:
            pass

    async def _read(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        try:
            async with self._reader().execute(sql, params) as cur:
                return list(await cur.fetchall())
        except sqlite3.OperationalError as exc:
            if is_transient(exc):
                raise StoreUnavailable(str(exc)) from exc
            raise

    # -- outcomes -----------------------------------------------------------

    async def apply_outcomes(self, outcomes: Sequence[Any]) -> None:
        """Apply a batch of :class:`~pipeline.models.Outcome` in one transaction.

        Idempotent and order-free: each field of a record is a join over every
        outcome ever applied to it —

        * ``status``/``reason``: of the outcome with the highest
          (:data:`~pipeline.rules.states.PRECEDENCE` rank, ``at``), i.e.
          ``states.merge``; ties on both go to the larger reason;
        * ``provider``, ``provider_msg_id``: of the highest such outcome that
          carries one (a receipt without them keeps the accepted attempt's);
        * ``retry_count``, ``updated_at``: max; ``created_at``: min ``at``;
        * ``sent_at``: first ACCEPTED ``at``; ``delivered_at``: first DELIVERED
          ``at``; ``accepted_at``: the event's acceptance time;
        * ``latency_ms``: to the first terminal outcome (the outcome's own
          ``latency_ms``, else ``at - accepted_at``); NULL while in flight.

        An outcome with an ``attempt`` adds it to ``attempts`` once per
        (delivery_id, seq). Raises :class:`StoreUnavailable` (nothing applied;
        retry the batch) or :class:`InvalidOutcome` (nothing applied).
        """
        if not outcomes:
            return
        folded: dict[str, list[Any]] = {}
        devices: dict[str, list[Any]] = {}  # device delivery id → [record id, devices, row]
        attempts: list[tuple[Any, ...]] = []
        bad: list[Any] = []
        for i, o in enumerate(outcomes):
            if i % FOLD_TURN == FOLD_TURN - 1:
                await asyncio.sleep(0)  # a batch of 2,000 folds for ~30 ms: let the loop breathe
            try:
                row = _row(o)
                a = o.attempt
                if a is not None:
                    attempts.append(_attempt_row(o, a))
            except (KeyError, TypeError, ValueError, AttributeError, OverflowError):
                bad.append(o)
                continue
            rid = ids.record_id(row[_DID])
            if rid != row[_DID]:  # a push to one device: its delivery, then its record
                dev = devices.get(row[_DID])
                if dev is None:
                    devices[row[_DID]] = [rid, getattr(o, "devices", 0) or 0, list(row)]
                else:
                    dev[1] = max(dev[1], getattr(o, "devices", 0) or 0)
                    _merge_rows(dev[2], row)
                row[_DID] = rid
            prev = folded.get(row[_DID])
            if prev is None:
                folded[row[_DID]] = row
            else:
                _merge_rows(prev, row)
        if bad:
            raise InvalidOutcome(f"{len(bad)} outcome(s) with an unknown state or bad fields", bad)
        rows = list(folded.values())
        device_rows = [store_devices.row(rid, did, n, r, _IX) for did, (rid, n, r) in devices.items()]
        push = [r[_DID] for r in rows if r[_CH] == "push"]

        async def work(db: aiosqlite.Connection) -> None:
            await db.executemany(_UPSERT, rows)
            if attempts:
                await db.executemany(_INSERT_ATTEMPT, attempts)
            if push:
                await store_devices.apply(db, device_rows, push, _K)

        try:
            await self._write(work)
        except sqlite3.IntegrityError as exc:
            # rare, so only now look for the culprits: a delivery_id that is not
            # ids.delivery_id(biz_key, user_id, channel), or a missing key field
            culprits = [
                o
                for o in outcomes
                if not all(isinstance(v, str) for v in (o.biz_key, o.user_id, o.channel,
                                                         o.notification_id, o.template))
                or ids.record_id(o.delivery_id) != ids.delivery_id(o.biz_key, o.user_id, o.channel, o.producer or "")
            ]  # fmt: skip
            if not culprits:
                raise
            raise InvalidOutcome(f"{len(culprits)} outcome(s) refused: {exc}", culprits) from exc

    async def apply_valid_outcomes(self, outcomes: Sequence[Any]) -> list[tuple[Any, str]]:
        """:meth:`apply_outcomes` for every outcome the store accepts: a refusal
        applies none of the batch, so the batch is applied again without the refused
        ones. Returns those, each with the refusal's reason. Raises
        :class:`StoreUnavailable` as :meth:`apply_outcomes` does."""
        rows = list(outcomes)
        refused: list[tuple[Any, str]] = []
        while rows:
            try:
                await self.apply_outcomes(rows)
                break
            except InvalidOutcome as exc:
                bad = {id(o) for o in exc.outcomes}
                if not bad:
                    raise
                refused += [(o, str(exc)) for o in exc.outcomes]
                rows = [o for o in rows if id(o) not in bad]
        return refused

    # -- inbox --------------------------------------------------------------

    async def add_inbox(self, items: Iterable[InboxItem | Mapping[str, Any]]) -> int:
        """Add messages to users' inboxes; returns how many were new (replays are ignored)."""
        now = time.time()
        rows = [
            (
                _field(it, "user_id"),
                _field(it, "delivery_id"),
                _field(it, "title") or "",
                _field(it, "body") or "",
                _field(it, "created_at") or now,
            )
            for it in items
        ]
        if not rows:
            return 0

        async def work(db: aiosqlite.Connection) -> int:
            cur = await db.executemany(
                "INSERT OR IGNORE INTO inbox (user_id, delivery_id, title, body, created_at)"
                " VALUES (?, ?, ?, ?, ?)",
                rows,
            )
            return cur.rowcount

        return await self._write(work)

    async def inbox(
        self, user_id: str, limit: int = 50, before: Optional[int] = None
    ) -> tuple[list[dict[str, Any]], int]:
        """Newest first: (items, unread count). Page on with ``before=items[-1]["id"]``."""
        limit = max(0, min(int(limit), 1000))
        sql = (
            "SELECT id, delivery_id, title, body, created_at, read_at FROM inbox"
            " WHERE user_id = ?"
        )
        params: list[Any] = [user_id]
        if before is not None:
            sql += " AND id < ?"
            params.append(int(before))
        sql += " ORDER BY id DESC LIMIT ?"
        params.append(limit)
        ro = self._reader()
        async with self._rlock:  # one snapshot for the items and the counter
            try:
                await ro.execute("BEGIN")
                try:
                    async with ro.execute(sql, params) as cur:
                        items = [dict(r) for r in await cur.fetchall()]
                    unread = await self._scalar(
                        ro, "SELECT unread FROM inbox_unread WHERE user_id = ?", (user_id,)
                    )
                finally:
                    await ro.execute("COMMIT")
            except sqlite3.OperationalError as exc:
                if is_transient(exc):
                    raise StoreUnavailable(str(exc)) from exc
                raise
        return items, int(unread or 0)

    async def mark_read(
        self, user_id: str, delivery_ids: Optional[Iterable[str]] = None, at: Optional[float] = None
    ) -> int:
        """Mark the given messages (all when ``None``) read; returns how many were unread."""
        at = time.time() if at is None else at
        if delivery_ids is None:

            async def work(db: aiosqlite.Connection) -> int:
                cur = await db.execute(
                    "UPDATE inbox SET read_at = ? WHERE user_id = ? AND read_at IS NULL",
                    (at, user_id),
                )
                return cur.rowcount

        else:
            params = [(at, user_id, d) for d in dict.fromkeys(delivery_ids)]
            if not params:
                return 0

            async def work(db: aiosqlite.Connection) -> int:
                cur = await db.executemany(
                    "UPDATE inbox SET read_at = ?"
                    " WHERE user_id = ? AND delivery_id = ? AND read_at IS NULL",
                    params,
                )
                return cur.rowcount

        return await self._write(work)

    # -- queries ------------------------------------------------------------

    async def get(self, delivery_or_notification_id: str) -> list[dict[str, Any]]:
        """The record of a delivery id, or every channel's record of a notification id."""
        key = delivery_or_notification_id
        col = "delivery_id" if "." in key else "notification_id"
        if col == "delivery_id":
            key = ids.record_id(key)  # a push's delivery to one device: its record
        rows = await self._read(
            f"SELECT {_RECORD_SELECT} FROM notify_record WHERE {col} = ? ORDER BY channel", (key,)
        )
        return [dict(r) for r in rows]

    async def by_provider_msg_id(
        self, provider_msg_id: str, provider: Optional[str] = None
    ) -> list[dict[str, Any]]:
        """Records carrying a provider's message id (to match a receipt)."""
        sql = f"SELECT {_RECORD_SELECT} FROM notify_record WHERE provider_msg_id = ?"
        params: list[Any] = [provider_msg_id]
        if provider is not None:
            sql += " AND provider = ?"
            params.append(provider)
        return [dict(r) for r in await self._read(sql, params)]

    async def find(
        self,
        biz_key: Optional[str] = None,
        user_id: Optional[str] = None,
        limit: int = 50,
        cursor: Optional[int] = None,
        producer: Optional[str] = None,
    ) -> tuple[list[dict[str, Any]], Optional[int]]:
        """Records newest first (by id), filtered (``producer``: only that
        producer's records); returns (rows, next cursor or None)."""
        limit = max(1, min(int(limit), 1000))
        where, params = [], []
        if producer is not None:
            where.append("producer = ?")
            params.append(producer)
        if biz_key is not None:
            where.append("biz_key = ?")
            params.append(biz_key)
        if user_id is not None:
            where.append("user_id = ?")
            params.append(user_id)
        if cursor is not None:
            where.append("id < ?")
            params.append(int(cursor))
        sql = f"SELECT {_RECORD_SELECT} FROM notify_record"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC LIMIT ?"
        params.append(limit)
        rows = [dict(r) for r in await self._read(sql, params)]
        return rows, (rows[-1]["id"] if len(rows) == limit else None)

    async def slo_events(self, since: float, until: float, producer: Optional[str] = None) -> list[Any]:
        """The events (one producer's business key) whose records were created in
        ``[since, until)``, aggregated for :func:`pipeline.rules.slo.summarize`:
        priority, category, acceptance, the slowest record's latency (None while
        any record is in flight) and whether any was deferred."""
        sql = ("SELECT max(priority), max(category), min(coalesce(accepted_at, created_at)),"
               " CASE WHEN max(latency_ms IS NULL) THEN NULL ELSE max(latency_ms) END,"
               " max(scheduled_at IS NOT NULL) FROM notify_record WHERE created_at >= ? AND created_at < ?")
        params: list[Any] = [since, until]
        if producer is not None:
            sql += " AND producer = ?"
            params.append(producer)
        sql += " GROUP BY producer, biz_key"
        return [EventRow(p or "", c or "", float(a), lat, bool(d)) for p, c, a, lat, d in await self._read(sql, params)]

    async def attempts(self, delivery_id: str) -> list[dict[str, Any]]:
        """The provider calls of a delivery; of a record, also those of its deliveries to
        each device (``delivery_id`` tells them apart)."""
        rows = await self._read(
            f"SELECT {', '.join(ATTEMPT_COLUMNS)} FROM attempts WHERE delivery_id = ?"
            " OR (delivery_id > ? AND delivery_id < ?) ORDER BY delivery_id, seq",
            (delivery_id, delivery_id + ".", delivery_id + "/"),
        )
        return [dict(r) for r in rows]

    async def deliveries(self, record_id: str) -> list[dict[str, Any]]:
        """A record's deliveries to each device (a push), oldest first; [] for a record
        delivered as a whole (pipeline/store_devices.py)."""
        rows = await self._read(
            f"SELECT {', '.join(store_devices.COLUMNS)} FROM device_deliveries WHERE record_id = ?"
            " ORDER BY created_at, delivery_id", (record_id,),
        )
        return [dict(r) for r in rows]

    async def counts_today(self, now: Optional[float] = None) -> dict[str, Any]:
        """Records created since midnight UTC (of ``now``), per state and per state × reason.

        ``{"since": ts, "total": n, "states": {state: n}, "reasons": {state: {reason: n}}}``
        """
        now = time.time() if now is None else now
        since = now - (now % 86400)
        rows = await self._read(
            "SELECT status, reason, count(*) FROM notify_record"
            " WHERE created_at >= ? AND created_at < ? GROUP BY status, reason",
            (since, since + 86400),
        )
        states: dict[str, int] = {}
        reasons: dict[str, dict[str, int]] = {}
        for status, reason, n in rows:
            states[status] = states.get(status, 0) + n
            if reason is not None:
                reasons.setdefault(status, {})[reason] = n
        ordered = {s: states[s] for s in PRECEDENCE if s in states}
        ordered.update({s: n for s, n in states.items() if s not in ordered})
        total = sum(states.values())
        return {"since": since, "total": total, "states": ordered, "reasons": reasons}

    async def attempt_counts(self, since: Optional[float] = None) -> list[dict[str, Any]]:
        """Attempts per (channel, provider, result), optionally since a time."""
        sql = "SELECT channel, provider, result, count(*) AS count FROM attempts"
        params: list[Any] = []
        if since is not None:
            sql += " WHERE started_at >= ?"
            params.append(since)
        sql += " GROUP BY channel, provider, result ORDER BY channel, provider, result"
        return [dict(r) for r in await self._read(sql, params)]
