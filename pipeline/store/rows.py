"""A batch of rows to SQLite in one statement: the rows as one JSON parameter,
read back by ``json_each`` (docs/adr/0007-one-statement-per-batch.md).

``executemany`` steps its statement once per row, and Python's sqlite3 lets the
GIL go around every step; the writer's thread then needs it back for the next
row from an event loop that is busy, a wait of up to the interpreter's switch
interval (5 ms) each time: a batch of 1,400 records took 38 ms beside an idle
loop and 0.1-16 s beside a busy one (the store alone, docs/adr/0007). Here a
batch is bound as one parameter, encoded in the loop's thread before the
transaction (:func:`bind`; ADR 0006's multi-row ``VALUES`` bound thousands), and
SQLite reads its rows inside one step: one release of the GIL per statement.

The values read are those ``executemany`` would have bound: a JSON string is
TEXT, an integer INTEGER, a number with a fraction or exponent REAL (orjson
writes a float that way, ``5.0`` for 5.0), ``true``/``false`` 1/0, ``null``
NULL. Two cases read otherwise, and go through ``executemany`` instead: text with
a NUL character (SQLite's JSON functions cut a string there), found in the
encoded batch as ``\\u0000``; and values orjson cannot encode (an integer past 64
bits: sqlite3 refuses it too). A float that is not finite (none reaches a row:
times come from clocks, what is read is checked finite) would be written NULL,
as SQLite writes NaN. tests/store/test_rows.py holds the rows written to what
``executemany`` writes.
"""

from __future__ import annotations

import sqlite3
from typing import Any, NamedTuple, Sequence

import orjson

__all__ = ["Bound", "Rows", "bind", "insert_rows", "run"]


class Rows(NamedTuple):
    """One statement, in both forms: from a JSON parameter, and ``executemany``'s."""

    json: str
    values: str


def insert_rows(into: str, columns: Sequence[str], tail: str = "") -> Rows:
    """``INSERT ...`` (``into``: "INSERT INTO t", "INSERT OR IGNORE INTO t") of
    ``columns``, each row a sequence in ``columns``' order; ``tail``: an ``ON
    CONFLICT`` clause (the ``WHERE true`` before it in the JSON form is SQLite's
    rule for an upsert from a SELECT)."""
    cols = ", ".join(columns)
    values = ", ".join(f"json_extract(value, '$[{i}]')" for i in range(len(columns)))
    end = f" {tail}" if tail else ""
    return Rows(f"{into} ({cols}) SELECT {values} FROM json_each(?) WHERE true{end}",
                f"{into} ({cols}) VALUES ({', '.join('?' * len(columns))}){end}")


class Bound(NamedTuple):
    """A statement with its parameters, ready to run (:func:`bind`)."""

    sql: str
    params: Any
    many: bool  #: ``executemany`` of ``params`` (rows), else ``execute`` with one parameter


def bind(statement: Rows, rows: Sequence[Sequence]) -> Bound:
    """``statement`` for ``rows``, its parameters encoded here: in the event loop's
    thread, before the transaction's job (store.py ``_transact``), so the writer's
    thread does not hold the GIL to encode them while the loop waits for it."""
    try:
        payload = orjson.dumps(rows)
    except TypeError:
        payload = None
    if payload is None or b"\\u0000" in payload:
        return Bound(statement.values, rows, True)
    return Bound(statement.json, (payload,), False)


def run(conn: sqlite3.Connection, bound: Bound) -> sqlite3.Cursor:
    """Run a :func:`bind` result on ``conn`` (the writer's connection, in its thread); its cursor."""
    if bound.many:
        return conn.executemany(bound.sql, bound.params)
    return conn.execute(bound.sql, bound.params)
