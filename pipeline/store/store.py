"""The record store: delivery records, attempts and the in-app inbox, on SQLite
— :class:`RecordStore` (open, pragmas, migration, writes and queries),
:class:`StoreUnavailable`, :class:`InvalidOutcome`, :func:`is_transient`. The
tables are described in schema.py, the merge of outcomes into records in
merge.py, a push's deliveries to each device in devices.py.

One file, WAL mode, ``synchronous=NORMAL``: a commit is an append to the WAL
(no fsync), readers never block the writer. A process crash loses nothing that
was committed; a power cut or OS crash may lose the last transactions (the
sink then re-reads those outcomes only if their offsets were not committed).

Two connections: one writer (every write goes through it, one transaction at a
time, each one job of its thread: ``RecordStore._transact``) and one ``query_only`` reader for the
API, support and CLI queries, so a long query never delays a sink batch.

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
import threading
import time
from dataclasses import dataclass
from collections.abc import Mapping  # (isinstance with typing's alias is a few Python calls)
from typing import Any, Callable, Iterable, Optional, Sequence

import aiosqlite

from .. import ids, threads
from ..rules.slo import EventRow
from ..rules.states import PRECEDENCE
from . import devices as devices_mod
from .merge import _K, batch_rows, fold
from .rows import bind, insert_rows, run
from .turn import WriteTurn
from .urgent import UrgentFirstLock
from .schema import (
    _ADDED_COLUMNS, _INSERT_ATTEMPT, _OBJECTS, _RECORD_SELECT, _ROW_COLUMNS, _SCHEMA, _UPSERT, ATTEMPT_COLUMNS,
    RECORD_COLUMNS,
    _rebuild_sql, of_record,
)  # fmt: skip

#: a push's delivery to one device as a record's row (``d``: device_deliveries, ``r``:
#: notify_record): the device delivery's own fields, the others its record's
_DEVICE_AS_RECORD = ", ".join(f"d.{c}" if c in devices_mod.COLUMNS else f"r.{c}" for c in RECORD_COLUMNS)

# aiosqlite logs a DEBUG record per statement, from its thread; with log records
# redacted as they are made (pipeline/redact.py) that cost ~15% of a worker's CPU
# under load for lines nobody reads
logging.getLogger("aiosqlite").setLevel(logging.WARNING)
log = logging.getLogger("notify.store")

__all__ = ["RecordStore", "StoreUnavailable", "InvalidOutcome", "InboxItem", "is_transient"]

#: an inbox message marked read now, as a read (mark_read)
_READS_FROM_INBOX = "INSERT OR IGNORE INTO reads (delivery_id, kind, at) SELECT delivery_id, 'inbox', ? FROM inbox"
#: an inbox batch in a few statements of many rows (rows.py)
_INSERT_INBOX = insert_rows("INSERT OR IGNORE INTO inbox", ("user_id", "delivery_id", "title", "body", "created_at"))
#: opt-outs in one statement (add_unsubscribes)
_INSERT_UNSUBSCRIBES = insert_rows("INSERT OR IGNORE INTO unsubscribes",
                                   ("user_id", "category", "channel", "source", "at", "producer"))

#: the outcome fold gives the event loop a turn every this many outcomes
FOLD_TURN = 256


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


async def _connect_writer(path: str) -> aiosqlite.Connection:
    """The write connection, its thread started by pipeline/threads.py's starter: in
    a main worker that thread holds the write lock the priority worker also waits
    for, so it must not run at the event loop's ``SCHED_IDLE``. (aiosqlite starts
    its thread when the connection is awaited; here it is started first, then
    connected, the two steps of ``Connection.__await__``.)"""
    conn = aiosqlite.connect(path, isolation_level=None)
    thread, connect = getattr(conn, "_thread", None), getattr(conn, "_connect", None)
    if not isinstance(thread, threading.Thread) or connect is None or thread.is_alive():
        return await conn  # another aiosqlite: its own way
    threads.start(thread)
    return await connect()


def _field(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


# ---------------------------------------------------------------------------


class RecordStore:
    """Delivery records, attempts and inboxes in one SQLite file (see the module docs
    here and in schema.py)."""

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
        self._wlock = UrgentFirstLock()  # an inbox row before queued record batches (urgent.py)
        self._rlock = asyncio.Lock()
        #: the writers of this file take turns in the kernel's queue (turn.py)
        self._turn: Optional[WriteTurn] = None if self.path == ":memory:" else WriteTurn(self.path)

    # -- lifecycle ----------------------------------------------------------

    async def open(self) -> "RecordStore":
        try:
            db = await _connect_writer(self.path)
        except sqlite3.OperationalError as exc:
            raise StoreUnavailable(f"cannot open {self.path}: {exc}") from exc
        self._db = db
        if not callable(getattr(db, "_execute", None)) or not hasattr(db, "_conn"):
            await db.close()
            self._db = None
            raise RuntimeError(f"aiosqlite {getattr(aiosqlite, '__version__', '?')} has no Connection._execute/_conn,"
                               " which the record store's writes run through (docs/adr/0007): pyproject.toml"
                               " pins the versions that have them")
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
        if all(c in cols or c in _ADDED_COLUMNS for c in _ROW_COLUMNS):
            await self._add_columns(db)
            return
        keep = ", ".join(c for c in _ROW_COLUMNS if c in cols)
        log.warning("%s: adding %s to notify_record (one-time rebuild)", self.path,
                    ", ".join(c for c in _ROW_COLUMNS if c not in cols))
        await db.executescript(_rebuild_sql(keep))

    async def _add_columns(self, db: aiosqlite.Connection) -> None:
        """Columns added without a rebuild (schema.py ``_ADDED_COLUMNS``), in one
        IMMEDIATE transaction: a process opening the same file at the same time
        finds them added."""
        await db.execute("BEGIN IMMEDIATE")
        try:
            cols = [r[1] for r in await db.execute_fetchall("PRAGMA table_info(notify_record)")]
            for name, kind in _ADDED_COLUMNS.items():
                if name not in cols:
                    log.warning("%s: adding %s to notify_record", self.path, name)
                    await db.execute(f"ALTER TABLE notify_record ADD COLUMN {name} {kind}")
            await db.execute("COMMIT")
        except BaseException:
            await db.execute("ROLLBACK")
            raise

    async def _pragmas(self, db: aiosqlite.Connection) -> None:
        await db.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_ms)}")
        await db.execute("PRAGMA temp_store=MEMORY")

    async def close(self) -> None:
        ro, db = self._ro, self._db
        self._ro = self._db = None
        if ro is not None and ro is not db:
            await ro.close()
        if db is not None:
            await db.close()  # after the jobs queued in its thread (a transaction holds the turn)
        if self._turn is not None:
            self._turn.close()

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

    async def _transact(self, work: Callable[[sqlite3.Connection], Any], urgent: bool = False) -> Any:
        """Run ``work(conn)`` (the writer's sqlite3 connection, in its thread) in one
        IMMEDIATE transaction; all or nothing. The turn, BEGIN, ``work``, COMMIT and the
        turn given back are one job of the writer's thread: one hop from the event loop
        and one back, the turn held for the SQL's own time, not across every await's
        wait for a busy loop (docs/adr/0007-record-writes-in-one-hop.md). Every write
        of the store comes here. A caller cancelled meanwhile does not stop the job:
        it commits or rolls back whole (the writes are idempotent or, the rare ones,
        harmless to have applied). An ``urgent`` write goes before the ordinary ones
        waiting in this process (urgent.py).

        The process's write lock is held until the job ends, even when the caller
        is cancelled before: the writer's thread runs its jobs in the order they
        were queued, so a job queued while another still runs would wait behind it
        whatever its urgency."""
        db = self._writer()
        await self._wlock.acquire(urgent=urgent)
        try:
            job = asyncio.ensure_future(db._execute(self._in_turn, db, work))  # aiosqlite: run in its thread
        except BaseException:
            self._wlock.release()
            raise
        job.add_done_callback(self._job_done)
        try:
            return await asyncio.shield(job)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            if is_transient(exc):
                raise StoreUnavailable(str(exc)) from exc
            raise

    def _job_done(self, job: asyncio.Future) -> None:
        self._wlock.release()
        if not job.cancelled():
            job.exception()  # seen here when its caller was cancelled and never looks

    def _in_turn(self, db: aiosqlite.Connection, work: Callable[[sqlite3.Connection], Any]) -> Any:
        """:meth:`_transact`'s job, in the writer's thread."""
        conn = db._conn
        turn = self._turn
        if turn is not None:
            turn.take()
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = work(conn)
                conn.execute("COMMIT")
            except BaseException:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:  # rolled back already (SQLITE_FULL, IOERR)
                    pass
                raise
            return result
        finally:
            if turn is not None:
                turn.give()

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
            if not fold(o, folded, devices, attempts):
                bad.append(o)
        if bad:
            raise InvalidOutcome(f"{len(bad)} outcome(s) with an unknown state or bad fields", bad)
        rows, device_rows, push = batch_rows(folded, devices)

        # the statements and their parameters made here, in the loop's thread (rows.py bind)
        bound = [bind(_UPSERT, rows)] + ([bind(_INSERT_ATTEMPT, attempts)] if attempts else [])
        bound_devices = bind(devices_mod.UPSERT, device_rows) if device_rows else None

        def work(conn: sqlite3.Connection) -> None:  # in the writer's thread: one job (_transact)
            for b in bound:
                run(conn, b)
            if push:
                devices_mod.apply(conn, bound_devices, push, _K)

        try:
            await self._transact(work)
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

        bound = bind(_INSERT_INBOX, rows)

        def work(conn: sqlite3.Connection) -> int:  # in the writer's thread: one job (_transact)
            return run(conn, bound)

        # what makes an inbox delivery DELIVERED, and what its user sees: before the
        # record batches waiting (an OTP's row behind a campaign's records)
        return await self._transact(work, urgent=True)

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
        """Mark the given messages (all when ``None``) read; returns how many were unread.
        Each message read now is also a read (``reads``, kind ``inbox``), in the same
        transaction."""
        at = time.time() if at is None else at
        if delivery_ids is None:

            def work(conn: sqlite3.Connection) -> int:
                n = conn.execute("UPDATE inbox SET read_at = ? WHERE user_id = ? AND read_at IS NULL",
                                 (at, user_id)).rowcount
                conn.execute(_READS_FROM_INBOX + " WHERE user_id = ? AND read_at = ?", (at, user_id, at))
                return n

        else:
            params = [(at, user_id, d) for d in dict.fromkeys(delivery_ids)]
            if not params:
                return 0

            def work(conn: sqlite3.Connection) -> int:
                n = conn.executemany("UPDATE inbox SET read_at = ?"
                                     " WHERE user_id = ? AND delivery_id = ? AND read_at IS NULL", params).rowcount
                conn.executemany(_READS_FROM_INBOX + " WHERE read_at = ? AND user_id = ? AND delivery_id = ?",
                                 [(at, *p) for p in params])
                return n

        return await self._transact(work)

    # -- tracking -----------------------------------------------------------

    async def add_click(self, delivery_id: str, link: int, url: str, at: Optional[float] = None,
                        ua_hash: Optional[str] = None) -> None:
        """One click on a tracked link (every click is kept; rates count deliveries)."""
        row = (delivery_id, int(link), url, time.time() if at is None else at, ua_hash)

        def work(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT INTO clicks (delivery_id, link, url, at, ua_hash) VALUES (?, ?, ?, ?, ?)", row)

        await self._transact(work)

    async def add_reads(self, reads: Iterable[tuple[str, str, float]], producer: Optional[str] = None) -> int:
        """``(delivery_id, kind, at)`` reads of deliveries that have a record (of
        ``producer``'s when given; a device's delivery id counts for its record);
        the first of each (delivery, kind) is kept. Returns how many were new."""
        rows = []
        for did, kind, at in reads:
            rid = ids.record_id(did)
            rows.append((rid, kind, at, rid) + ((producer,) if producer is not None else ()))
        if not rows:
            return 0
        sql = ("INSERT OR IGNORE INTO reads (delivery_id, kind, at) SELECT ?, ?, ?"
               " WHERE EXISTS (SELECT 1 FROM notify_record WHERE delivery_id = ?"
               + (" AND producer = ?" if producer is not None else "") + ")")

        def work(conn: sqlite3.Connection) -> int:
            # one by one: executemany's rowcount is not reliable for INSERT … SELECT
            return sum(max(conn.execute(sql, r).rowcount, 0) for r in rows)

        return await self._transact(work)

    async def add_unsubscribes(self, rows: Iterable[tuple[str, str, str, str, float, str]]) -> int:
        """Opt-outs: ``(user_id, category, channel, source, at, producer)``; one that is
        there already (same user, switch and ``at``: a replayed update) is ignored.
        Returns how many were new."""
        rows = list(rows)
        if not rows:
            return 0

        bound = bind(_INSERT_UNSUBSCRIBES, rows)

        def work(conn: sqlite3.Connection) -> int:  # in the writer's thread: one job (_transact)
            return run(conn, bound)  # (an ignored row changes nothing: not counted)

        return await self._transact(work)

    async def unsubscribes(self, user_id: Optional[str] = None, since: Optional[float] = None,
                           producer: Optional[str] = None, limit: int = 100) -> list[dict[str, Any]]:
        """Opt-outs newest first, filtered."""
        where, params = [], []
        for col, op, v in (("user_id", "=", user_id), ("at", ">=", since), ("producer", "=", producer)):
            if v is not None:
                where.append(f"{col} {op} ?")
                params.append(v)
        sql = "SELECT user_id, category, channel, source, at, producer FROM unsubscribes"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY at DESC, id DESC LIMIT ?"
        params.append(max(1, min(int(limit), 1000)))
        return [dict(r) for r in await self._read(sql, params)]

    async def rates(self, since: float, until: float, producer: Optional[str] = None) -> list[dict[str, Any]]:
        """Per template and channel, the records created in ``[since, until)``:
        ``records``, ``sent`` (a provider took it: sent_at or delivered_at set),
        ``delivered``, ``clicked`` and ``read`` (deliveries with at least one
        click / read), and the rates delivered/sent, clicked/sent, read/sent
        (None when nothing was sent)."""
        sql = ("SELECT template_code, channel, count(*),"
               " sum(sent_at IS NOT NULL OR delivered_at IS NOT NULL), sum(status = 'DELIVERED'),"
               " sum(EXISTS (SELECT 1 FROM clicks c WHERE c.delivery_id = r.delivery_id)),"
               " sum(EXISTS (SELECT 1 FROM reads x WHERE x.delivery_id = r.delivery_id))"
               " FROM notify_record r WHERE created_at >= ? AND created_at < ?")
        params: list[Any] = [since, until]
        if producer is not None:
            sql += " AND producer = ?"
            params.append(producer)
        sql += " GROUP BY template_code, channel ORDER BY template_code, channel"
        out = []
        for tpl, channel, n, sent, delivered, clicked, read in await self._read(sql, params):
            sent, delivered, clicked, read = int(sent or 0), int(delivered or 0), int(clicked or 0), int(read or 0)

            def rate(x: int) -> Optional[float]:
                return round(x / sent, 4) if sent else None

            out.append({"template": tpl, "channel": channel, "records": n, "sent": sent, "delivered": delivered,
                        "clicked": clicked, "read": read, "delivery_rate": rate(delivered),
                        "click_rate": rate(clicked), "read_rate": rate(read)})
        return out

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

    async def awaiting_receipts(self, after: tuple[float, str], until: float, providers: Sequence[str],
                                limit: int) -> list[dict[str, Any]]:
        """Records still ACCEPTED (no receipt yet) through one of ``providers``, sent
        after the cursor ``after`` (``(sent_at, delivery_id)``) and at or before
        ``until``, oldest first, at most ``limit`` (agents/polls.py)."""
        if not providers:
            return []
        marks = ", ".join("?" * len(providers))
        rows = await self._read(
            f"SELECT {_RECORD_SELECT}, callback FROM notify_record INDEXED BY ix_record_awaiting"
            f" WHERE status = 'ACCEPTED' AND sent_at <= ? AND (sent_at, delivery_id) > (?, ?)"
            f" AND provider IN ({marks}) ORDER BY sent_at, delivery_id LIMIT ?",
            (until, after[0], after[1], *providers, limit))
        return [dict(r) for r in rows]

    async def poll_cursor(self) -> Optional[tuple[float, str]]:
        """How far the receipt polls went (None: never polled)."""
        rows = await self._read("SELECT sent_at, delivery_id FROM receipt_polls WHERE id = 0")
        return (float(rows[0][0]), str(rows[0][1])) if rows else None

    async def set_poll_cursor(self, cursor: tuple[float, str]) -> None:
        def work(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT INTO receipt_polls (id, sent_at, delivery_id) VALUES (0, ?, ?)"
                         " ON CONFLICT (id) DO UPDATE SET sent_at = excluded.sent_at,"
                         " delivery_id = excluded.delivery_id", tuple(cursor))

        await self._transact(work)

    async def by_provider_msg_ids(self, provider_msg_ids: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
        """The deliveries carrying each of these providers' message ids (to match a take
        of receipts; ids without a delivery are absent from the answer): records of a
        whole channel, and a push's deliveries to one device, each as its record's row
        with the device delivery's own ``delivery_id``, status, provider and times (a
        push record's state is derived from its devices': a receipt decides the device's
        delivery, pipeline/store/devices.py). A push record is not returned besides its
        matching device deliveries. Two indexed reads per 500 ids."""
        out: dict[str, list[dict[str, Any]]] = {}
        wanted = list(dict.fromkeys(provider_msg_ids))
        for i in range(0, len(wanted), 500):
            chunk = wanted[i:i + 500]
            marks = ", ".join("?" * len(chunk))
            devices = [dict(r) for r in await self._read(
                f"SELECT {_DEVICE_AS_RECORD}, r.callback, d.provider_msg_id AS _matched"
                f" FROM device_deliveries d JOIN notify_record r"
                f" ON r.delivery_id = d.record_id WHERE d.provider_msg_id IN ({marks})", chunk)]
            records = [dict(r) for r in await self._read(
                f"SELECT {_RECORD_SELECT}, callback FROM notify_record WHERE provider_msg_id IN ({marks})", chunk)]
            shown = {(d["_matched"], ids.record_id(d["delivery_id"])) for d in devices}
            for r in records:
                if (r["provider_msg_id"], r["delivery_id"]) not in shown:
                    out.setdefault(r["provider_msg_id"], []).append(r)
            for d in devices:
                out.setdefault(d.pop("_matched"), []).append(d)
        return out

    async def by_provider_msg_id(
        self, provider_msg_id: str, provider: Optional[str] = None
    ) -> list[dict[str, Any]]:
        """:meth:`by_provider_msg_ids` for one message id, those sent through ``provider``
        only when given."""
        rows = (await self.by_provider_msg_ids([provider_msg_id])).get(provider_msg_id, [])
        return [r for r in rows if provider is None or r["provider"] == provider]

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
            f"SELECT {', '.join(ATTEMPT_COLUMNS)} FROM attempts WHERE {of_record('delivery_id', '?1')}"
            " ORDER BY delivery_id, seq",
            (delivery_id,),
        )
        return [dict(r) for r in rows]

    async def deliveries(self, record_id: str) -> list[dict[str, Any]]:
        """A record's deliveries to each device (a push), oldest first; [] for a record
        delivered as a whole (pipeline/store/devices.py)."""
        rows = await self._read(
            f"SELECT {', '.join(devices_mod.COLUMNS)} FROM device_deliveries WHERE record_id = ?"
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
